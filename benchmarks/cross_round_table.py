"""Single-round against cross-round attacks on recorded runs: docs/attacks.md's "Across rounds, measured" table.

Each run directory holds ``attack-cross-round.json`` (``privfed attack RUN --method cross-round``: the cross-round
estimates and, in ``single_round``, the decoder with the same fit on the round's own release),
``attack-client-models.json`` (``--method decoder --client-models``) and, for ``ddp-sums``,
``attack-decoder.json`` (the secure sum). Runs are named ``MECHANISM-sSEED``. Prints, per mechanism and round, the
mean over seeds and its spread (min..max over seeds) of each figure's advantage over its null.

    python benchmarks/cross_round_table.py RUNS_DIR
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from privfed.run.directory import RunDirectory

NAME = re.compile(r"(?P<mechanism>.+)-s(?P<seed>\d+)$")


def advantage(row: dict[str, Any] | None, score: str) -> float | None:
    """The row's advantage over its null in ``score`` (None: not scored)."""
    if not row or score not in row:
        return None
    return float(row[score]) - float(row[f"null_{score}"])


def psnr_advantage(row: dict[str, Any] | None) -> float | None:
    """PSNR over the null's: to the source (reps), the best member (kanon), or the best client image (members
    unknown: DP)."""
    for score in ("psnr_source", "psnr_best_member", "psnr_best_client"):
        if (value := advantage(row, score)) is not None:
            return value
    return None


def cell(values: list[float | None], digits: int = 2) -> str:
    """Mean over seeds and min..max, or a dash."""
    kept = [v for v in values if v is not None]
    if not kept:
        return "–"
    mean = statistics.fmean(kept)
    return f"{mean:+.{digits}f} [{min(kept):+.{digits}f}, {max(kept):+.{digits}f}] (n={len(kept)})"


def per_seed(values: list[float | None]) -> str:
    """Each seed's count, or a dash."""
    kept = [f"{v:.0f}" for v in values if v is not None]
    return " / ".join(kept) or "–"


def rows_of(path: Path) -> dict[int, dict[str, Any]]:
    if not path.exists():
        return {}
    return {row["round"]: row for row in json.loads(path.read_text())["rounds"]}


def figures(run: Path) -> dict[int, dict[str, float | None]]:
    """Per attacked round, the advantages this table reports."""
    memory_size = RunDirectory(run).config().memory_size
    cross, own, summed = (rows_of(run / f"attack-{n}.json") for n in ("cross-round", "client-models", "decoder"))
    out: dict[int, dict[str, float | None]] = {}
    for round_index in sorted(set(cross) | set(own) | set(summed)):
        c, o, s = cross.get(round_index), own.get(round_index), summed.get(round_index)
        single = c.get("single_round") if c else None
        groups_single = (single or {}).get("by_client_size", {})
        groups_cross = (c or {}).get("by_client_size", {})
        per_client = (c or {}).get("matched_cosine_per_client", [])
        small = [p for p in per_client if p["images"] < memory_size]
        out[round_index] = {
            "single psnr": psnr_advantage(single or s),
            "cross psnr": psnr_advantage(c),
            "own-model psnr": psnr_advantage(o),
            "single reid": advantage(single, "reid_rate"),
            "cross reid": advantage(c, "reid_rate"),
            "single psnr, small": psnr_advantage(groups_single.get("fewer_images_than_memory")),
            "cross psnr, small": psnr_advantage(groups_cross.get("fewer_images_than_memory")),
            "single psnr, large": psnr_advantage(groups_single.get("at_least_memory_images")),
            "cross psnr, large": psnr_advantage(groups_cross.get("at_least_memory_images")),
            "small vectors": float(groups_single.get("fewer_images_than_memory", {}).get("vectors", 0)) if c else None,
            "cos single−null": None if not c or "matched_cosine" not in c
            else c["single_round_matched_cosine"] - c["null_matched_cosine"],
            "cos cross−null": None if not c or "matched_cosine" not in c
            else c["matched_cosine"] - c["null_matched_cosine"],
            "cos cross−single, small": statistics.fmean(
                p["matched_cosine"] - p["single_round_matched_cosine"] for p in small
            ) if small else None,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    args = parser.parse_args()
    table: dict[tuple[str, int], dict[str, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    for run in sorted(p for p in args.runs.iterdir() if p.is_dir() and NAME.match(p.name)):
        match = NAME.match(run.name)
        assert match is not None
        for round_index, values in figures(run).items():
            for name, value in values.items():
                table[(match["mechanism"], round_index)][name].append(value)
    groups = (
        ("PSNR to the source (reps), best member (kanon) or best client (DP), dB", ("single psnr", "cross psnr", "own-model psnr"), 2),
        ("re-identification rate", ("single reid", "cross reid"), 3),
        ("matched cosine to the memory", ("cos single−null", "cos cross−null", "cos cross−single, small"), 3),
        ("PSNR by client size, dB", ("single psnr, small", "cross psnr, small", "single psnr, large",
                                     "cross psnr, large"), 2),
    )
    for title, names, digits in groups:
        print(f"\n{title}: advantage over the null, mean over seeds [min, max]\n")
        print("| mechanism | round | " + " | ".join(names) + " |")
        print("|---|---|" + "---|" * len(names))
        for (mechanism, round_index), cells in sorted(table.items()):
            print(f"| {mechanism} | {round_index} | " + " | ".join(cell(cells[n], digits) for n in names) + " |")
    print("\nattacked vectors of clients with fewer images than memory_size, per seed\n")
    print("| mechanism | round | small vectors |\n|---|---|---|")
    for (mechanism, round_index), cells in sorted(table.items()):
        print(f"| {mechanism} | {round_index} | {per_seed(cells['small vectors'])} |")


if __name__ == "__main__":
    main()
