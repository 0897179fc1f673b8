"""The default run (`privfed train`) per seed, next to what docs/usage.md's picture claims.

Prints, per seed: the untrained and final kNN accuracy, the worst
round-to-round kNN drop, and how SecAgg+'s clipping fared (tensors that
overflowed, rounds whose model update was therefore not applied). Then the
docs/usage.md's claim (the alt text of ``docs/images/default-run.png``) beside seed
0, and exits 1 when they differ by more than that text's rounding: the
picture has gone stale.

Training is chaotic in its floating point: a torch release with other CPU
kernels gives the same seed another trajectory (see ``docs/flower.md``,
"Reproducibility"), so the check holds for the torch this prints.

    python benchmarks/default_run.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
README_CLAIM = re.compile(r"kNN accuracy rising from ([0-9.]+) to ([0-9.]+) over (\d+) rounds")


def readme_claim() -> tuple[float, float, int]:
    """(untrained kNN, final kNN, rounds) as the README's picture states them."""
    found = README_CLAIM.search((REPO / "docs" / "usage.md").read_text())
    if found is None:
        raise SystemExit("docs/usage.md states no default-run figure (its picture's alt text changed form)")
    return float(found[1]), float(found[2]), int(found[3])


def default_run(seed: int, out: Path) -> dict:
    """One `privfed train --seed SEED` from this checkout; its summary and per-round figures."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-m", "privfed.cli", "train", "--seed", str(seed), "--out", str(out)],
                   cwd=REPO, env=env, check=True, capture_output=True)
    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    knn = [summary["knn_accuracy_init"], *(r["knn_accuracy"] for r in rounds if r.get("knn_accuracy") is not None)]
    return {
        "seed": seed,
        "knn_init": summary["knn_accuracy_init"],
        "knn": summary["knn_accuracy"],
        "worst_drop": max([0.0, *(a - b for a, b in itertools.pairwise(knn))]),
        "rejected_tensors": int(sum(r.get("secagg_rejected_tensors") or 0 for r in rounds)),
        "overflow_rounds": summary["secure_aggregation"].get("overflow_rounds", 0),
        "rounds": summary["rounds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()
    claimed_init, claimed, claimed_rounds = readme_claim()
    print(f"torch {torch.__version__}; README: kNN {claimed_init:.2f} -> {claimed:.2f} over {claimed_rounds} rounds (seed 0)")
    print("seed  untrained  final   worst drop  overflowed tensors  rounds not applied")
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in args.seeds:
            r = default_run(seed, Path(folder) / f"seed{seed}")
            results.append(r)
            print(f"{seed:4d}  {r['knn_init']:9.4f}  {r['knn']:.4f}  {r['worst_drop']:10.4f}  "
                  f"{r['rejected_tensors']:18d}  {r['overflow_rounds']:18d}")
    finals = [r["knn"] for r in results]
    if len(finals) > 1:
        print(f"final kNN {statistics.mean(finals):.4f} ± {statistics.stdev(finals):.4f} (mean ± std over {len(finals)} seeds)")
    seed0 = next((r for r in results if r["seed"] == 0), None)
    if seed0 is None:
        return
    stale = (abs(seed0["knn"] - claimed) > 0.005 or abs(seed0["knn_init"] - claimed_init) > 0.005
             or seed0["rounds"] != claimed_rounds)
    print("README figure: " + ("STALE, regenerate docs/images/default-run.png and its alt text" if stale else "current"))
    if stale:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
