"""The CPU privacy study on today's code: every mechanism on the CPU preset, 3 seeds, the README's results table.

The protocol of docs/privacy.md ("On the CPU preset"): ``configs/cpu-cifar10.toml``
on the 5,085 dev CIFAR-10 images (20 non-IID clients, half per round, G 16,
L 8, memory 128), 20 rounds of one local epoch, seeds 0 to 2. Each setting
trains through :func:`setting_comparison.ensure_run` (finished runs under
``--out`` are reused) with ``--record-releases``, then gets a linear probe
and the attack of its last round (``privfed attack --rounds 20 --steps 500``:
``cross-round``, which also scores the round's own release, or ``decoder``
on ``ddp-sums``' secure sum); the table is printed from the runs' rows, which
``--rows`` saves.

    python benchmarks/privacy_rerun.py --out runs/privacy-rerun --rows rows.json   # trains what is missing
    python benchmarks/privacy_rerun.py --from-rows docs/results/privacy-cpu-cifar10-rerun/rows.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cross_round_table import figures  # benchmarks/ on the path
from setting_comparison import add_linear_probe, ensure_run, finished_runs, markdown_table

DATASET = "arrays:../shared/data/cifar10-dev.npz"
PROTOCOL = {"rounds": 20, "local_epochs": 1, "record_releases": True}
#: Setting name -> (the table's label, the options it changes).
SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "reps": ("`reps` (no privacy)", {"mechanism": "reps"}),
    "kanon": ("`kanon` (not DP)", {"mechanism": "kanon"}),
    "ldp10": ("`ldp`, total ε 10", {"mechanism": "ldp", "epsilon": 10.0}),
    "sums10": ("`ldp-sums`, total ε 10", {"mechanism": "ldp-sums", "epsilon": 10.0}),
    "sums1": ("`ldp-sums`, total ε 1", {"mechanism": "ldp-sums", "epsilon": 1.0}),
    "ddp10": ("`ddp-sums`, total ε 10", {"mechanism": "ddp-sums", "epsilon": 10.0}),
    "ddp1": ("`ddp-sums`, total ε 1", {"mechanism": "ddp-sums", "epsilon": 1.0}),
    "fixed": ("fixed random centroids", {"method": "orchestra-fixed-centroids", "record_releases": False}),
}
SEEDS = (0, 1, 2)
ATTACK_ROUND = 20
ATTACK_STEPS = 500
#: Row key -> the table's column: PSNR over the null's at the attacked round, dB.
ATTACK_COLUMNS = {"attack_single_psnr": "attack, one round (dB)", "attack_cross_psnr": "attack, across rounds (dB)"}


def attack_method(name: str) -> str | None:
    """The attack a setting's runs get: none without releases, ``decoder`` on a secure sum, else ``cross-round``."""
    overrides = SETTINGS[name][1]
    if not overrides.get("record_releases", PROTOCOL["record_releases"]):
        return None
    return "decoder" if overrides.get("mechanism") == "ddp-sums" else "cross-round"


def ensure_attack(run: Path, method: str) -> None:
    """``attack-METHOD.json`` in ``run`` (the names ``cross_round_table`` reads), attacked unless already there."""
    target = run / f"attack-{method}.json"
    if target.exists():
        return
    from privfed import api

    api.attack(run, method=method, rounds=[ATTACK_ROUND], steps=ATTACK_STEPS, device="cpu")
    (run / "attack.json").replace(target)


def with_attack(row: dict[str, Any], run: Path) -> dict[str, Any]:
    """``row`` with the PSNR advantages of ``run``'s saved attack at :data:`ATTACK_ROUND` (None: not attacked)."""
    found = figures(run).get(ATTACK_ROUND, {})
    return {**row, "attack_single_psnr": found.get("single psnr"), "attack_cross_psnr": found.get("cross psnr")}


def signed_spread(key: str) -> Callable[[list[dict[str, Any]]], str]:
    """A column's cell: ``+mean ± std`` over the seeds that have ``key``, or a dash."""

    def cell(rows: list[dict[str, Any]]) -> str:
        values = [r[key] for r in rows if r.get(key) is not None]
        if not values:
            return "–"
        return f"{statistics.fmean(values):+.2f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.2f}"

    return cell


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """The README's table of the settings present in ``results``, in :data:`SETTINGS`' order."""
    labels = {name: label for name, (label, _) in SETTINGS.items() if name in results}
    extra = {header: signed_spread(key) for key, header in ATTACK_COLUMNS.items()}
    return markdown_table(results, reference="kanon", labels=labels, extra=extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/cpu-cifar10.toml"))
    parser.add_argument("--dataset", default=DATASET, help="the dev images (an arrays:PATH.npz)")
    parser.add_argument("--out", type=Path, help="train the missing runs here (NAME-seedN folders)")
    parser.add_argument("--rows", type=Path, help="save every run's row here (JSON)")
    parser.add_argument("--from-rows", type=Path, help="print the table of saved rows, training nothing")
    parser.add_argument("--no-attack", action="store_true", help="leave the runs unattacked (no attack columns)")
    args = parser.parse_args()
    if args.from_rows is not None:
        print(table(json.loads(args.from_rows.read_text())))
        return
    if args.out is None:
        parser.error("give --out (to train) or --from-rows")
    for name, (_, overrides) in SETTINGS.items():
        for seed in SEEDS:
            run = args.out / f"{name}-seed{seed}"
            ensure_run(args.config, {**PROTOCOL, "dataset": args.dataset, **overrides}, seed, run)
            add_linear_probe(run)
            if not args.no_attack and (method := attack_method(name)) is not None:
                ensure_attack(run, method)
    results = {
        name: [with_attack(row, args.out / f"{name}-seed{row['seed']}") for row in rows]
        for name, rows in finished_runs(args.out).items()
        if name in SETTINGS
    }
    if args.rows is not None:
        args.rows.write_text(json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
