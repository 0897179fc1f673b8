"""Wall time of the default run under `privfed train` and under `flwr run .`.

Flower 1.41 deprecates ``run_simulation`` (what ``privfed train`` calls) in
favour of ``flwr run``, which submits the app to a SuperLink running the
simulation runtime. This times both on the same default run, seed by seed,
alternating which goes first, each as a user would wait for it: from the
command until it returns. Each ``flwr run`` gets a fresh ``FLWR_HOME``, so it
starts its own local SuperLink (as ``privfed train`` would have to, if it moved
to that path); the SuperLink is stopped afterwards. Both runs of a seed must
also end with the same kNN accuracy: they train the same apps on the same plan.

Needs an otherwise idle machine; the figures are only comparable to each other.
Both runtimes import privfed from this checkout's parent of ``benchmarks/``
(``PYTHONPATH``), so a copy of the code being edited elsewhere is not picked up.

    python benchmarks/entry_point_timing.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def code_env() -> dict[str, str]:
    """The environment both runtimes run in: privfed imported from this checkout."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def privfed_train(seed: int, out: Path, extra: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "privfed.cli", "train", "--seed", str(seed), "--out", str(out), *extra],
                   cwd=REPO, env=code_env(), check=True, capture_output=True)
    return time.perf_counter() - started


def flwr_run(seed: int, out: Path, home: Path, num_clients: int, run_config: str) -> float:
    env = {**code_env(), "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    flwr = shutil.which("flwr") or "flwr"
    command = [flwr, "run", ".", "--run-config", f"seed={seed} out='{out}' {run_config}".strip(),
               "--federation-config", f"num-supernodes={num_clients} client-resources-num-cpus=1", "--stream"]
    started = time.perf_counter()
    try:
        subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True)
        while not (out / "summary.json").exists():  # --stream can return a moment before the app has written it
            if time.perf_counter() - started > 3600:
                raise TimeoutError(f"no summary.json in {out}")
            time.sleep(0.2)
        return time.perf_counter() - started
    finally:
        subprocess.run(["pkill", "-f", f"flower-superlink.*{home}"], check=False)


def knn(out: Path) -> float:
    return float(json.loads((out / "summary.json").read_text())["knn_accuracy"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=None, help="override the default run's rounds")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    train_extra = [] if args.rounds is None else ["--rounds", str(args.rounds)]
    run_config = "" if args.rounds is None else f"rounds={args.rounds}"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="privfed-entry-") as scratch:
        folder = Path(scratch)
        for position, seed in enumerate(args.seeds):
            order = ["train", "flwr"] if position % 2 == 0 else ["flwr", "train"]
            row: dict[str, Any] = {"seed": seed, "first": order[0]}
            for path in order:
                out = folder / f"{path}-seed{seed}"
                if path == "train":
                    row["train_s"] = privfed_train(seed, out, train_extra)
                else:
                    row["flwr_s"] = flwr_run(seed, out, folder / f"home-{seed}", 10, run_config)
                row[f"{path}_knn"] = knn(out)
            row["ratio"] = row["flwr_s"] / row["train_s"]
            rows.append(row)
            print(f"seed {seed}: privfed train {row['train_s']:.1f} s (kNN {row['train_knn']:.4f}), "
                  f"flwr run {row['flwr_s']:.1f} s (kNN {row['flwr_knn']:.4f}), ratio {row['ratio']:.3f}", flush=True)
    ratios = [row["ratio"] for row in rows]
    spread = f" (min {min(ratios):.3f}, max {max(ratios):.3f})" if len(ratios) > 1 else ""
    print(f"flwr run / privfed train wall time: mean {statistics.mean(ratios):.3f}{spread} over {len(rows)} seeds")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
