"""A study's pictures: accuracy per setting, against the privacy budget, and against the attack's advantage.

Each point is a setting's mean ± std over its finished seeds. Drawn without pyplot (:func:`_figure`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privfed.run.curves import dataset_name, fit_layout
from privfed.studies.grid import setting_label
from privfed.studies.runner import CellRecord

#: The mechanisms drawn as horizontal reference lines (they have no ε).
REFERENCE_MECHANISMS = ("reps", "kanon")
EPSILON_PLOT = "accuracy-vs-epsilon.png"
ATTACK_PLOT = "accuracy-vs-attack.png"
SETTINGS_PLOT = "accuracy-by-setting.png"
#: The accuracy columns of the per-setting picture, and how its legend names them.
ACCURACY_BARS = {"knn": "kNN monitor", "linear": "linear probe"}


@dataclass(frozen=True)
class SettingPoint:
    """One setting's mean and spread over seeds of two row values."""

    name: str
    label: str
    line: str  # the label without its ε: the settings of one series on the ε plot share it
    row: dict[str, Any]
    x: float
    x_std: float
    y: float
    y_std: float


def setting_points(records: list[CellRecord], x: str, y: str) -> list[SettingPoint]:
    """Every setting with ``x`` and ``y`` in all of its finished rows, in study order."""
    points = []
    labels = setting_labels(records)
    for name in dict.fromkeys(r.name for r in records):
        rows = [r.row for r in records if r.name == name and r.finished and r.row is not None]
        if rows and all(isinstance(row.get(x), (int, float)) and isinstance(row.get(y), (int, float)) for row in rows):
            xs, ys = [float(row[x]) for row in rows], [float(row[y]) for row in rows]
            points.append(SettingPoint(name, *labels[name], rows[0], statistics.fmean(xs), _std(xs), statistics.fmean(ys),
                                       _std(ys)))
    return points


def setting_labels(records: list[CellRecord]) -> dict[str, tuple[str, str]]:
    """Each setting's label and its label without ε (``ldp, ε=0.8`` and ``ldp``); by name for a record without
    its options (written by hand, say)."""
    labels = {}
    for record in records:
        if record.name not in labels:
            options = record.overrides
            if options is None:
                labels[record.name] = (record.name, without_epsilon(record.name))
            else:
                labels[record.name] = (setting_label(options),
                                       setting_label({k: v for k, v in options.items() if k != "epsilon"}))
    return labels


def study_context(records: list[CellRecord]) -> str:
    """What every finished cell shares, for a title: ``dataset cifar10-dev · method orchestra``; empty when nothing is."""
    finished = [r for r in records if r.finished and r.row is not None]
    datasets = {dataset_name(r.settings["train"]["dataset"]) if r.settings else None for r in finished}
    methods = {r.row.get("method") for r in finished if r.row is not None}
    shared = [(what, next(iter(values))) for what, values in (("dataset", datasets), ("method", methods)) if len(values) == 1]
    return " · ".join(f"{what} {value}" for what, value in shared if value is not None)


def _title(what: str, records: list[CellRecord]) -> str:
    context = study_context(records)
    return f"{what}\n{context}" if context else what


def accuracy_column(records: list[CellRecord]) -> str:
    """The linear probe's accuracy where the study has it, else the kNN monitor's."""
    return "linear" if any(r.row and r.row.get("linear") is not None for r in records) else "knn"


def plot_accuracy_vs_epsilon(records: list[CellRecord], path: Path) -> Path | None:
    """Accuracy against the total ε budget per mechanism, ``reps`` and ``kanon`` as reference lines (docs/studies.md);
    series sharing an ε are nudged apart so their bars stay apart."""
    accuracy = accuracy_column(records)
    budgeted = setting_points(records, "epsilon_budget", accuracy)
    if not budgeted:
        return None
    references = [p for p in setting_points(records, accuracy, accuracy)  # (x is unused for a horizontal line)
                  if p.row.get("mechanism") in REFERENCE_MECHANISMS and p.row.get("epsilon_budget") is None]
    fig, (ax,) = _figure((6.4, 4.4))
    lines = list(dict.fromkeys(p.line for p in budgeted))
    for index, line_label in enumerate(lines):
        mine = sorted((p for p in budgeted if p.line == line_label), key=lambda p: p.x)
        nudge = 1.04 ** (index - (len(lines) - 1) / 2)  # a multiplicative step: the axis is logarithmic
        ax.errorbar([p.x * nudge for p in mine], [p.y for p in mine], yerr=[p.y_std for p in mine], marker="os^Dv"[index % 5],
                    linestyle="none", capsize=3, label=line_label)
    for index, point in enumerate(references):
        line = ax.axhline(point.y, linestyle="--", color=f"C{(index + len(lines)) % 10}", label=f"{point.label} (no ε)")
        ax.axhspan(point.y - point.y_std, point.y + point.y_std, color=line.get_color(), alpha=0.12)
    budgets = sorted({p.x for p in budgeted})
    ax.set_xscale("log")
    ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
    ax.minorticks_off()
    if len(budgets) == 1:
        ax.set_xlim(budgets[0] / 2, budgets[0] * 2)
    ax.set_xlabel("total ε per client (budget, log scale)")
    ax.set_ylabel(f"{ACCURACY_BARS[accuracy]} accuracy")
    ax.legend(fontsize=8)
    ax.set_title(_title("Accuracy against the privacy budget, mean ± std over seeds", records), fontsize=9)
    return _save(fig, path)


#: The attack columns drawn (``privfed.studies.cell_work.ATTACK_COLUMNS``), a panel each, and what each axis says.
ATTACK_AXES = {
    "attack_advantage_psnr": "advantage over its null, dB PSNR\nto the best-matching member (reps: the source)",
    "attack_advantage_psnr_client": "advantage over its null, dB PSNR\nto the closest of the client's images",
}


def plot_accuracy_vs_attack(records: list[CellRecord], path: Path) -> Path | None:
    """Per setting, the attack's advantage over its null against accuracy, a panel per attack column (docs/studies.md):
    the member figure is sharper but unknown for DP releases, the client figure has every mechanism."""
    accuracy = accuracy_column(records)
    panels = [(column, points) for column in ATTACK_AXES if (points := setting_points(records, column, accuracy))]
    if not panels:
        return None
    fig, axes = _figure((6.4, 4.4) if len(panels) == 1 else (11.0, 4.4), columns=len(panels))
    colours = {name: f"C{index % 10}" for index, name in enumerate(dict.fromkeys(r.name for r in records))}
    for ax, (column, points) in zip(axes, panels):
        for p in points:
            ax.errorbar(p.x, p.y, xerr=p.x_std, yerr=p.y_std, marker="o", capsize=3, color=colours[p.name], label=p.label)
        ax.axvline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel(ATTACK_AXES[column], fontsize=9)
        ax.set_ylabel(f"{ACCURACY_BARS[accuracy]} accuracy")
        ax.legend(fontsize=7)
    fig.suptitle(_title("Accuracy against what the attacker recovers, mean ± std over seeds", records), fontsize=10)
    return _save(fig, path)


def plot_accuracy_by_setting(records: list[CellRecord], path: Path) -> Path | None:
    """Each setting's kNN and linear accuracy as bars (mean ± std over seeds), the untrained network's as lines (docs/studies.md)."""
    bars = {column: {p.name: p for p in setting_points(records, column, column)} for column in ACCURACY_BARS}
    names = [name for name in dict.fromkeys(r.name for r in records) if any(name in points for points in bars.values())]
    if not names:
        return None
    fig, (ax,) = _figure((6.4, 1.6 + 0.45 * len(names)))
    height = 0.8 / len(ACCURACY_BARS)
    for offset, (column, label) in enumerate(ACCURACY_BARS.items()):
        mine = [(row, bars[column][name]) for row, name in enumerate(names) if name in bars[column]]
        ax.barh([row + (offset - (len(ACCURACY_BARS) - 1) / 2) * height for row, _ in mine], [p.y for _, p in mine],
                height=height, xerr=[p.y_std for _, p in mine], capsize=3, color=f"C{offset}", label=label)
        if untrained := setting_points(records, f"{column}_init", f"{column}_init"):
            ax.axvline(statistics.fmean(p.y for p in untrained), linestyle="--", color=f"C{offset}",
                       label=f"{label}, untrained network")
    labels = setting_labels(records)
    ax.set_yticks(range(len(names)), [labels[name][0] for name in names], fontsize=8)
    ax.invert_yaxis()  # the study's order, top to bottom
    ax.set_xlabel("accuracy")
    ax.set_ylabel("setting")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2)  # below: bars reach right
    ax.set_title(_title("Accuracy per setting, mean ± std over seeds", records), fontsize=9)
    return _save(fig, path)


def write_study_plots(records: list[CellRecord], folder: Path) -> list[Path]:
    """Every picture the study has the data for."""
    drawn = [plot_accuracy_by_setting(records, folder / SETTINGS_PLOT), plot_accuracy_vs_epsilon(records, folder / EPSILON_PLOT),
             plot_accuracy_vs_attack(records, folder / ATTACK_PLOT)]
    return [path for path in drawn if path is not None]


def without_epsilon(setting: str) -> str:
    """A setting's name without its ε option: the settings on one line of the ε plot share it."""
    parts = [part for part in setting.split("_") if not part.startswith("epsilon-")]
    return "_".join(parts) or setting


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _figure(size: tuple[float, float], *, columns: int = 1) -> tuple[Any, list[Any]]:
    """A Figure and its row of axes, made without pyplot: the caller's backend stays as it was."""
    from privfed.extras import require

    require("matplotlib", feature="a study's plots")

    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    return fig, list(fig.subplots(1, columns, squeeze=False)[0])


def _save(fig: Any, path: Path) -> Path:
    fit_layout(fig)
    fig.savefig(path, dpi=100)
    return path
