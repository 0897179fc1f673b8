"""A study's tables: ``results.csv`` (a row per run) and ``results.md`` (each setting's mean ± std over seeds)."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path
from typing import Any

from privfed.studies.runner import CellRecord


def result_rows(records: list[CellRecord]) -> list[dict[str, Any]]:
    """One row per run: the cell's name and seed, its row or its error (a list, such as ``covers``, joined by "; ")."""
    return [
        {"cell": r.name, "seed": r.seed, **_flat(r.row or {}), **({"error": r.error} if r.error else {})}
        for r in records
    ]


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    return {key: "; ".join(map(str, value)) if isinstance(value, list) else value for key, value in row.items()}


def write_csv(records: list[CellRecord], path: Path) -> Path:
    rows = result_rows(records)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def summarise(values: list[Any]) -> str:
    """``mean ± std (n)`` for numbers (std over seeds, 0 for one), the distinct values for anything else."""
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if numbers and len(numbers) == len([v for v in values if v is not None]):
        spread = statistics.stdev(numbers) if len(numbers) > 1 else 0.0
        return f"{statistics.fmean(numbers):.4g} ± {spread:.2g} ({len(numbers)})"
    distinct = list(dict.fromkeys(str(v) for v in values if v is not None))
    return "; ".join(distinct) if distinct else "-"


#: Columns too long for a table cell: ``results.md`` lists each distinct privacy statement once, below the table.
PROSE_COLUMNS = ("statement", "covers", "not_covered", "privacy_details")


def markdown_table(records: list[CellRecord]) -> str:
    """Each setting (in study order) with every column of its rows summarised over its seeds, and failures counted."""
    settings = list(dict.fromkeys(r.name for r in records))
    columns = [c for c in dict.fromkeys(key for r in records if r.row for key in r.row) if c not in PROSE_COLUMNS]
    lines = [
        "| setting | runs | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for name in settings:
        mine = [r for r in records if r.name == name]
        finished = [r.row for r in mine if r.finished and r.row is not None]
        failed = len(mine) - len(finished)
        runs = f"{len(finished)}" + (f" ({failed} failed)" if failed else "")
        cells = [summarise([row.get(c) for row in finished]) for c in columns]
        lines.append(f"| {name} | {runs} | " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def prose_sections(records: list[CellRecord]) -> str:
    """Each distinct privacy statement once (headline, covers, not covered, details), with the settings and seeds it applies to."""
    groups: dict[tuple[Any, ...], dict[str, list[int]]] = {}
    per_setting: dict[str, set[tuple[Any, ...]]] = {}
    for r in records:
        if not r.finished or r.row is None or r.row.get("statement") is None:
            continue
        key = tuple(_hashable(r.row.get(column)) for column in PROSE_COLUMNS)
        groups.setdefault(key, {}).setdefault(r.name, []).append(r.seed)
        per_setting.setdefault(r.name, set()).add(key)
    if not groups:
        return ""
    entries = []
    for number, (key, settings) in enumerate(groups.items(), start=1):
        statement, covers, not_covered, details = key
        where = ", ".join(
            f"**{name}**" + (f" ({_seeds(seeds)})" if len(per_setting[name]) > 1 else "") for name, seeds in settings.items()
        )
        lines = [f"### Statement {number}", "", f"Applies to {where}.", "", f"> {statement}", ""]
        for title, items in (("Covers", covers), ("Not covered", not_covered)):
            if items is not None:
                lines += [f"- {title}:" + ("" if items else " nothing"), *(f"  - {item}" for item in items)]
        if details is not None:
            lines.append(f"- The long text: `{details}` in the privfed repository")
        entries.append("\n".join(lines).rstrip() + "\n")
    return "\n## Privacy statements\n\n" + "\n".join(entries)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def write_markdown(records: list[CellRecord], path: Path, *, title: str, cells: int | None = None) -> Path:
    """Writes ``results.md``; ``cells`` (the study's number of cells) marks a table of a study not yet finished."""
    errors = [f"- {r.name} seed {r.seed}: {r.error}" for r in records if r.error]
    text = f"# {title}\n\n"
    if cells is not None and len(records) < cells:
        text += f"**Partial: {len(records)} of the study's {cells} runs are recorded; the same command continues it.**\n\n"
    text += f"Mean ± standard deviation over seeds (number of finished runs).\n\n{markdown_table(records)}"
    text += prose_sections(records)
    if errors:
        text += "\n## Failed runs\n\n" + "\n".join(errors) + "\n"
    path.write_text(text)
    return path


def tuning_ranking(records: list[CellRecord], *, accuracy: str = "linear") -> str:
    """Settings ranked by their mean label-free tuning score, with its two parts, the label-based accuracy and their Spearman correlation.

    A setting without a finite score (a diverged run) is listed as not scored instead of ranked.
    """
    from scipy.stats import spearmanr

    rows, unscored = [], []
    for name in dict.fromkeys(r.name for r in records):
        finished = [r.row for r in records if r.name == name and r.finished and r.row is not None]
        scored = [row for row in finished if _finite(row.get("tuning_score"))]
        scores = [row["tuning_score"] for row in scored]
        accuracies = [row[accuracy] for row in finished if _finite(row.get(accuracy))]
        parts = [summarise([row.get(part) for row in scored]) for part in ("alignment", "uniformity")]
        if scores:
            rows.append((name, statistics.fmean(scores), accuracies, scores, parts))
        elif finished:
            unscored.append(name)
    rows.sort(key=lambda entry: entry[1], reverse=True)
    lines = [f"| rank | setting | tuning score (Align + 0.2 Unif) | alignment | uniformity | {accuracy} accuracy |",
             "|---|---|---|---|---|---|"]
    for rank, (name, _, accuracies, scores, parts) in enumerate(rows, start=1):
        lines.append(f"| {rank} | {name} | {summarise(scores)} | {' | '.join(parts)} | {summarise(accuracies)} |")
    lines.append("\nA collapsed encoder (every image at one point: alignment 1, uniformity 0) scores 1.0, above most "
                 "encoders that spread their images: read a high score's uniformity before trusting it.")
    paired = [(score, statistics.fmean(accs)) for _, score, accs, _, _ in rows if accs]
    if len(paired) >= 3:
        rho = spearmanr([p[0] for p in paired], [p[1] for p in paired]).statistic
        lines.append(f"\nSpearman rank correlation of score and {accuracy} accuracy over {len(paired)} settings: {rho:.2f}")
    if unscored:
        lines.append(f"\nNot scored (no finite score, e.g. a diverged run): {', '.join(unscored)}")
    return "\n".join(lines) + "\n"


def _seeds(seeds: list[int]) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(seed) for seed in seeds)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
