"""Compare training settings over several seeds: final kNN mean ± spread, and whether the clustering bites.

Each ``--setting NAME:key=value,key=value`` overrides options of the preset
(any ``privfed train`` option, TOML values); every setting runs once per
seed through the real Flower pipeline. Printed per setting: final kNN
accuracy on the preset's test split (mean, sample std, min-max over seeds),
and the last training round's normalised target entropy and mean best
centroid cosine (means over seeds). The untrained encoder is a row of its own.
Because the encoder still moves from one evaluation to the next, the mean kNN
of each run's last three evaluations is printed too (a steadier figure).
With ``--baseline NAME`` each setting also gets its paired difference to that
setting (same seeds): mean ± std of the per-seed kNN differences.

A run already finished under ``--out`` is read back instead of trained again,
so a comparison can be extended seed by seed; ``--tabulate`` prints the table
of every finished ``NAME-seedN`` run under ``--out`` without training.

    python benchmarks/setting_comparison.py --config configs/cpu-cifar10.toml \\
        --setting kmeans:global_clustering=\\"kmeans\\" --setting official:global_clustering=\\"official\\" \\
        --seeds 0 1 2 --out runs/clustering-study
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from privfed.config import build_config
from privfed.federation.simulation import simulate
from privfed.methods import NO_CENTROIDS, get_method
from privfed.run.directory import RunDirectory
from privfed.run.evaluation import evaluate_run
from privfed.run.plan import plan_run


def parse_setting(text: str) -> tuple[str, dict[str, Any]]:
    """``name:key=value,...`` -> (name, overrides); values are TOML (quote strings)."""
    name, _, assignments = text.partition(":")
    overrides = tomllib.loads("\n".join(a.strip() for a in assignments.split(",") if a.strip()))
    return name, overrides


def incomplete(run_dir: Path) -> str | None:
    """Why a run cannot stand for its setting (None: it ran every round with every sampled client)."""
    if not (run_dir / "summary.json").is_file():
        return "no summary.json"
    summary = json.loads((run_dir / "summary.json").read_text())
    configured = json.loads((run_dir / "config.json").read_text())["rounds"]
    if summary.get("stopped_early") or summary["rounds"] < configured:
        return f"stopped after round {summary['rounds']} of {configured}: {summary.get('stopped_early')}"
    failures = sum(m.get("client_failures", 0) for m in RunDirectory(run_dir).metrics())
    if failures:
        return f"{failures} client failures"
    return None


def ensure_run(config_file: Path, overrides: dict[str, Any], seed: int, out: Path) -> dict[str, Any]:
    """The summary of one setting at one seed, trained unless ``out`` already holds that complete run.

    An incomplete run (stopped early, or with failed clients) is trained again
    from scratch, into the same directory.
    """
    reason = incomplete(out) if out.is_dir() else "not run"
    if reason is not None:
        if out.is_dir() and reason != "no summary.json":
            print(f"  {out.name}: {reason}; training it again", flush=True)
            shutil.rmtree(out)
        # The rows read the clients' metrics (target entropy, timings), which they send only when asked to.
        options = {"report_client_metrics": True, **overrides}
        simulate(plan_run(build_config(config_file, **options, seed=seed, out=str(out))))
        if (problem := incomplete(out)) is not None:
            raise RuntimeError(f"{out.name} did not complete: {problem}")
    return json.loads((out / "summary.json").read_text())


def run_one(config_file: Path, overrides: dict[str, Any], seed: int, out: Path) -> dict[str, Any]:
    ensure_run(config_file, overrides, seed, out)
    return row_of(out, seed)


def row_of(run_dir: Path, seed: int) -> dict[str, Any]:
    """A finished run's final kNN and its last training round's clustering diagnostics."""
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = RunDirectory(run_dir).metrics()
    method = json.loads((run_dir / "config.json").read_text()).get("method", "orchestra")
    clusters = get_method(method).centroids != NO_CENTROIDS
    trained = [m for m in metrics if m.get("target_entropy") is not None] if clusters else []
    last = trained[-1] if trained else {}
    evaluations = [m["knn_accuracy"] for m in metrics if m.get("knn_accuracy") is not None]
    weighted = [m["weighted_vector_fraction"] for m in metrics if m.get("weighted_vector_fraction") is not None]
    return {
        "seed": seed,
        "knn": summary["knn_accuracy"],
        "knn_last3": statistics.fmean(evaluations[-3:]) if evaluations else summary["knn_accuracy"],
        "knn_init": summary["knn_accuracy_init"],
        "target_entropy": last.get("target_entropy"),
        "centroid_cosine": last.get("centroid_cosine"),
        "cosine_last5": _tail_mean([m["centroid_cosine"] for m in trained if m.get("centroid_cosine") is not None]),
        "weighted_last5": _tail_mean(weighted),
        "linear": _linear_probe(run_dir),
        "wall_s": summary["wall_seconds"],
    }


def _tail_mean(values: list[float], rounds: int = 5) -> float | None:
    """Mean of the last ``rounds`` values (None when there are none)."""
    return statistics.fmean(values[-rounds:]) if values else None


def _linear_probe(run_dir: Path) -> float | None:
    """The final checkpoint's linear-probe accuracy, if ``--linear`` (or ``privfed evaluate``) recorded it."""
    records = RunDirectory(run_dir).evaluations()
    found = [r["accuracy"] for r in records if r.get("protocol") == "linear" and Path(r["checkpoint"]).stem == "final"]
    return found[-1] if found else None


def add_linear_probe(run_dir: Path) -> None:
    """Trains the linear probe on the run's own data and test split (``privfed evaluate --protocol linear``)."""
    if _linear_probe(run_dir) is not None:
        return
    config = json.loads((run_dir / "config.json").read_text())
    evaluate_run(run_dir, train_data=config["dataset"], test_data=config.get("test_dataset") or config["dataset"],
                 protocol="linear", device="cpu")


def finished_runs(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Every finished ``NAME-seedN`` run under ``root``, grouped by setting name, in seed order."""
    results: dict[str, list[dict[str, Any]]] = {}
    for run_dir in sorted(root.glob("*-seed*")):
        name, _, seed = run_dir.name.rpartition("-seed")
        if not seed.isdigit() or not (run_dir / "summary.json").is_file():
            continue
        if (reason := incomplete(run_dir)) is not None:
            print(f"left out {run_dir.name}: {reason}")
            continue
        results.setdefault(name, []).append(row_of(run_dir, int(seed)))
    return {name: sorted(rows, key=lambda r: r["seed"]) for name, rows in results.items()}


def describe(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4f} ± {spread:.4f} ({min(values):.4f}–{max(values):.4f})"


def mean_of(rows: list[dict[str, Any]], key: str) -> str:
    values = [r[key] for r in rows if r[key] is not None]
    return f"{statistics.fmean(values):.3f}" if values else "-"


def paired_difference(rows: list[dict[str, Any]], baseline: list[dict[str, Any]], key: str = "knn") -> str:
    """``key`` minus the baseline's, seed by seed, over the seeds both have."""
    base = {r["seed"]: r[key] for r in baseline}
    differences = [r[key] - base[r["seed"]] for r in rows if r["seed"] in base]
    if not differences:
        return "-"
    spread = statistics.stdev(differences) if len(differences) > 1 else 0.0
    return f"{statistics.fmean(differences):+.4f} ± {spread:.4f} (n={len(differences)})"


def print_table(results: dict[str, list[dict[str, Any]]], baseline: str | None) -> None:
    print(f"\n{'setting':<20} {'seeds':<8} {'final kNN mean ± std (min–max)':<40} {'last-3 mean ± std':<18} "
          f"{'entropy':>8} {'cosine':>7}" + (f"  final, last-3 vs {baseline} (paired)" if baseline else ""))
    first = next(iter(results.values()))
    print(f"{'untrained':<20} {'':<8} {describe([r['knn_init'] for r in first]):<40} {'':<18} {'-':>8} {'-':>7}")
    for name, rows in results.items():
        seeds = ",".join(str(r["seed"]) for r in rows)
        tail = [r["knn_last3"] for r in rows]
        tail_text = f"{statistics.fmean(tail):.4f} ± {statistics.stdev(tail) if len(tail) > 1 else 0.0:.4f}"
        line = (f"{name:<20} {seeds:<8} {describe([r['knn'] for r in rows]):<40} {tail_text:<18} "
                f"{mean_of(rows, 'target_entropy'):>8} {mean_of(rows, 'centroid_cosine'):>7}")
        if baseline and name != baseline and baseline in results:
            base = results[baseline]
            line += f"  {paired_difference(rows, base)}, {paired_difference(rows, base, 'knn_last3')}"
        print(line)
    print(f"\n{'setting':<20} {'centroid cosine, last 5 rounds':<32} {'weighted vectors, last 5':<26} {'linear probe':<20}")
    for name, rows in results.items():
        print(f"{name:<20} {_spread(rows, 'cosine_last5'):<32} {_spread(rows, 'weighted_last5'):<26} {_spread(rows, 'linear'):<20}")


def _spread(rows: list[dict[str, Any]], key: str) -> str:
    """``mean ± sample std`` over the seeds that have ``key``."""
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return "-"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.3f}"


def markdown_table(
    results: dict[str, list[dict[str, Any]]],
    *,
    reference: str,
    labels: dict[str, str],
    extra: Mapping[str, Callable[[list[dict[str, Any]]], str]] | None = None,
) -> str:
    """The README's table: centroid cosine over the last 5 rounds, its share of ``reference``'s (ratio of means), final
    kNN and linear probe, mean ± std over seeds; one row per setting in ``labels`` (name -> label), in that order.
    ``extra`` adds columns: header -> the cell of a setting's rows."""
    extra = extra or {}
    header = ["setting", "centroid cosine, last 5 rounds", "share of `kanon`", "kNN", "linear probe", *extra]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    base = statistics.fmean(r["cosine_last5"] for r in results[reference])
    for name, label in labels.items():
        rows = results[name]
        cosines = [r["cosine_last5"] for r in rows if r["cosine_last5"] is not None]
        share = f"{statistics.fmean(cosines) / base:.2f}" if cosines else "–"
        cosine = _spread(rows, "cosine_last5").replace("-", "–")
        cells = [label, cosine, share, _spread(rows, "knn"), _spread(rows, "linear"), *(f(rows) for f in extra.values())]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/cpu-cifar10.toml"))
    parser.add_argument("--setting", action="append", default=[], help="NAME:key=value,... (repeatable)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (finished ones are reused)")
    parser.add_argument("--json", type=Path, default=None, help="also write every run's row as JSON")
    parser.add_argument("--baseline", default=None, help="setting NAME to report paired differences against")
    parser.add_argument("--tabulate", action="store_true", help="only print the table of the finished runs in --out")
    parser.add_argument("--linear", action="store_true", help="also train a linear probe on each final encoder")
    args = parser.parse_args()
    if args.tabulate:
        if args.out is None:
            parser.error("--tabulate needs --out")
        results = finished_runs(args.out)
        if not results:
            parser.error(f"no finished NAME-seedN runs under {args.out}")
        print_table(results, args.baseline)
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=2))
        return
    if not args.setting:
        parser.error("give at least one --setting (or --tabulate)")
    root = args.out or Path(tempfile.mkdtemp(prefix="privfed-settings-"))
    results = {}
    for name, overrides in map(parse_setting, args.setting):
        for seed in args.seeds:
            ensure_run(args.config, overrides, seed, root / f"{name}-seed{seed}")
            if args.linear:
                add_linear_probe(root / f"{name}-seed{seed}")
            row = row_of(root / f"{name}-seed{seed}", seed)
            results.setdefault(name, []).append(row)
            print(f"  {name} seed {seed}: kNN {row['knn']:.4f} ({row['wall_s']:.0f}s)", flush=True)
    print_table(results, args.baseline)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
