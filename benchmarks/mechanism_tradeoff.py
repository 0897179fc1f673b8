"""kNN accuracy of Orchestra under each release mechanism, with release vs training time.

Runs the whole training (Flower simulation) once per setting and seed, and
prints one row per setting: final kNN accuracy (mean ± std over seeds), its
paired difference to ``reps`` (the no-privacy baseline, same seeds), the
untrained encoder's kNN, the worst-case client's spent epsilon, the smallest
anonymity set, and the mean time of one release next to the mean time of a
client's local training in a round. ``rotpred`` (nothing released) is the
floor: a mechanism no better than it gives the clustering nothing to use.

    python benchmarks/mechanism_tradeoff.py --config configs/cpu-cifar10.toml --out runs/tradeoff
    python benchmarks/mechanism_tradeoff.py --config configs/quick.toml --rounds 2 --seeds 0 --epsilons 1

``--record-releases`` also keeps what the server received, so that
``benchmarks/attack_comparison.py`` can attack the same runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from setting_comparison import ensure_run  # benchmarks/ is on the path when run as a script

from privfed.run.directory import RunDirectory


def _cell(value: float | int | None, spec: str) -> str:
    """A table cell; ``-`` for quantities a mechanism does not have (e.g. epsilon of kanon)."""
    width = int(spec.lstrip(">").split(".")[0].rstrip("dfge"))
    return "-".rjust(width) if value is None else format(value, spec)


def settings(epsilons: list[float]) -> list[tuple[str, dict[str, Any]]]:
    """(name, overrides) of every row: rotpred (nothing released: the floor), reps, kanon, ldp per epsilon."""
    return [
        ("rotpred", {"method": "rotpred"}),
        ("reps", {"mechanism": "reps"}),
        ("kanon", {"mechanism": "kanon"}),
        *[(f"ldp-eps{eps:g}", {"mechanism": "ldp", "epsilon": eps}) for eps in epsilons],
    ]


def run_one(config_file: Path, overrides: dict[str, Any], seed: int, out: Path) -> dict[str, Any]:
    """Trains one row at one seed, unless ``out`` already holds that finished run."""
    summary = ensure_run(config_file, overrides, seed, out)
    metrics = RunDirectory(out).metrics()
    train = [m["train_seconds"] for m in metrics if m.get("train_seconds") is not None]
    release = [m["release_seconds"] for m in metrics if m.get("release_seconds") is not None]
    return {
        "seed": seed,
        "knn": summary["knn_accuracy"],
        "knn_init": summary["knn_accuracy_init"],
        "epsilon_spent": summary["privacy"]["epsilon"],
        "delta": summary["privacy"]["delta"],
        "k": summary["privacy"]["k"],
        "release_s": statistics.fmean(release) if release else None,
        "train_s": statistics.fmean(train) if train else float("nan"),
        "wall_s": summary["wall_seconds"],
    }


def spread(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4f} ± {std:.4f}"


def mean_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/cpu-cifar10.toml"))
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=None, help="override the preset's rounds (shorter runs)")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (finished ones are reused)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument("--only", nargs="+", default=None, help="run only these rows (e.g. kanon reps)")
    parser.add_argument(
        "--record-releases", action="store_true", help="record the runs' releases too, for benchmarks/attack_comparison.py"
    )
    args = parser.parse_args()
    extra: dict[str, Any] = {} if args.rounds is None else {"rounds": args.rounds}
    if args.record_releases:
        extra["record_releases"] = True
    root = args.out or Path(tempfile.mkdtemp(prefix="privfed-tradeoff-"))
    results: dict[str, list[dict[str, Any]]] = {}
    for seed in args.seeds:  # seed by seed, so an interrupted study still has every row for the first seeds
        for name, overrides in settings(args.epsilons):
            if args.only is not None and name not in args.only:
                continue
            row = run_one(args.config, {**overrides, **extra}, seed, root / f"{name}-seed{seed}")
            results.setdefault(name, []).append(row)
            print(f"  {name} seed {seed}: kNN {row['knn']:.4f} ({row['wall_s']:.0f}s)", flush=True)
    print(
        f"\n{'setting':<12} {'kNN mean ± std':>16} {'vs reps (paired)':>18} {'kNN init':>8} {'eps spent':>9} "
        f"{'delta':>8} {'k':>4} {'release s':>9} {'train s':>8}"
    )
    reps = {r["seed"]: r["knn"] for r in results.get("reps", [])}
    for name, rows in results.items():
        paired = [r["knn"] - reps[r["seed"]] for r in rows if r["seed"] in reps]
        print(
            f"{name:<12} {spread([r['knn'] for r in rows]):>16} {spread(paired) if paired else '-':>18} "
            f"{statistics.fmean(r['knn_init'] for r in rows):>8.4f} "
            f"{_cell(mean_or_none([r['epsilon_spent'] for r in rows]), '>9.3f')} "
            f"{_cell(mean_or_none([r['delta'] for r in rows]), '>8.1e')} "
            f"{_cell(min((r['k'] for r in rows if r['k'] is not None), default=None), '>4d')} "
            f"{_cell(mean_or_none([r['release_s'] for r in rows]), '>9.4f')} "
            f"{statistics.fmean(r['train_s'] for r in rows):>8.2f}",
            flush=True,
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
