"""A study's pictures: accuracy per setting, against the privacy budget, and against the attack's advantage.

Each point is a setting's mean over its finished seeds, with the standard
deviation over seeds as error bars; a picture the study has no data for is
not drawn. On the ε plot, the settings that differ only in ε make one line,
and every ``reps`` or ``kanon`` setting is its own reference line, so a study
that also varies, say, the method never pools two methods into one line.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    row: dict[str, Any]
    x: float
    x_std: float
    y: float
    y_std: float


def setting_points(records: list[CellRecord], x: str, y: str) -> list[SettingPoint]:
    """Every setting with ``x`` and ``y`` in all of its finished rows, in study order."""
    points = []
    for name in dict.fromkeys(r.name for r in records):
        rows = [r.row for r in records if r.name == name and r.finished and r.row is not None]
        if rows and all(isinstance(row.get(x), (int, float)) and isinstance(row.get(y), (int, float)) for row in rows):
            xs, ys = [float(row[x]) for row in rows], [float(row[y]) for row in rows]
            points.append(SettingPoint(name, rows[0], statistics.fmean(xs), _std(xs), statistics.fmean(ys), _std(ys)))
    return points


def accuracy_column(records: list[CellRecord]) -> str:
    """The linear probe's accuracy where the study has it, else the kNN monitor's."""
    return "linear" if any(r.row and r.row.get("linear") is not None for r in records) else "knn"


def plot_accuracy_vs_epsilon(records: list[CellRecord], path: Path) -> Path | None:
    """Accuracy against the total ε budget per mechanism, with ``reps`` and ``kanon`` as reference lines."""
    accuracy = accuracy_column(records)
    budgeted = setting_points(records, "epsilon_budget", accuracy)
    if not budgeted:
        return None
    references = [p for p in setting_points(records, accuracy, accuracy)  # (x is unused for a horizontal line)
                  if p.row.get("mechanism") in REFERENCE_MECHANISMS and p.row.get("epsilon_budget") is None]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for line_name in dict.fromkeys(without_epsilon(p.name) for p in budgeted):
        mine = sorted((p for p in budgeted if without_epsilon(p.name) == line_name), key=lambda p: p.x)
        ax.errorbar([p.x for p in mine], [p.y for p in mine], yerr=[p.y_std for p in mine], marker="o", capsize=3,
                    label=f"{line_name} (mean ± std over seeds)")
    for index, point in enumerate(references):
        line = ax.axhline(point.y, linestyle="--", color=f"C{(index + 3) % 10}", label=f"{point.name} (no ε)")
        ax.axhspan(point.y - point.y_std, point.y + point.y_std, color=line.get_color(), alpha=0.12)
    ax.set_xscale("log")
    ax.set_xlabel("total ε per client (budget)")
    ax.set_ylabel(f"{accuracy} accuracy")
    ax.legend(fontsize=8)
    ax.set_title("Accuracy against the privacy budget", fontsize=10)
    return _save(fig, plt, path)


#: The attack columns drawn (``privfed.studies.cell_work.ATTACK_COLUMNS``), a panel each, and what each axis says.
ATTACK_AXES = {
    "attack_advantage_psnr": "advantage over its null, dB PSNR\nto the best-matching member (reps: the source)",
    "attack_advantage_psnr_client": "advantage over its null, dB PSNR\nto the closest of the client's images",
}


def plot_accuracy_vs_attack(records: list[CellRecord], path: Path) -> Path | None:
    """One point per setting: the attack's advantage over its null against accuracy, seed spread as error bars.

    A panel per attack column with any setting in it: the member figure is
    the sharper one but is unknown for DP releases (their members cannot be
    replayed), so the client figure puts every mechanism on one axis.
    """
    accuracy = accuracy_column(records)
    panels = [(column, points) for column in ATTACK_AXES if (points := setting_points(records, column, accuracy))]
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4, 4.4) if len(panels) == 1 else (11.0, 4.4), squeeze=False)
    colours = {name: f"C{index % 10}" for index, name in enumerate(dict.fromkeys(r.name for r in records))}
    for ax, (column, points) in zip(axes[0], panels):
        for p in points:
            ax.errorbar(p.x, p.y, xerr=p.x_std, yerr=p.y_std, marker="o", capsize=3, color=colours[p.name], label=p.name)
        ax.axvline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel(ATTACK_AXES[column], fontsize=9)
        ax.set_ylabel(f"{accuracy} accuracy")
        ax.legend(fontsize=7)
    fig.suptitle("Accuracy against what the attacker recovers (mean ± std over seeds)", fontsize=10)
    return _save(fig, plt, path)


def plot_accuracy_by_setting(records: list[CellRecord], path: Path) -> Path | None:
    """Each setting's kNN and linear accuracy as bars (mean ± std over seeds), the untrained network's as lines.

    The picture of a comparison with no ε and no attack (the method study);
    the untrained network's accuracies (``knn_init``, ``linear_init``) mark
    what training added at all.
    """
    bars = {column: {p.name: p for p in setting_points(records, column, column)} for column in ACCURACY_BARS}
    names = [name for name in dict.fromkeys(r.name for r in records) if any(name in points for points in bars.values())]
    if not names:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 1.6 + 0.45 * len(names)))
    height = 0.8 / len(ACCURACY_BARS)
    for offset, (column, label) in enumerate(ACCURACY_BARS.items()):
        mine = [(row, bars[column][name]) for row, name in enumerate(names) if name in bars[column]]
        ax.barh([row + (offset - (len(ACCURACY_BARS) - 1) / 2) * height for row, _ in mine], [p.y for _, p in mine],
                height=height, xerr=[p.y_std for _, p in mine], capsize=3, color=f"C{offset}", label=label)
        if untrained := setting_points(records, f"{column}_init", f"{column}_init"):
            ax.axvline(statistics.fmean(p.y for p in untrained), linestyle="--", color=f"C{offset}",
                       label=f"{label}, untrained network")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()  # the study's order, top to bottom
    ax.set_xlabel("accuracy")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2)  # below: bars reach right
    ax.set_title("Accuracy per setting (mean ± std over seeds)", fontsize=10)
    return _save(fig, plt, path)


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


def _pyplot() -> Any:
    from privfed.extras import require

    require("matplotlib", feature="a study's plots")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, plt: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
