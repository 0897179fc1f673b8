"""``curves.png``: a run's round-by-round figures, alone or overlaid with other runs (``privfed plot``).

The figures come from ``metrics.jsonl`` only, so any finished, stopped or still-running run can be drawn.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privfed.config import TrainConfig
from privfed.data.datasets import arrays_file
from privfed.durable import check_path
from privfed.errors import PrivfedError
from privfed.run.directory import RunDirectory

logger = logging.getLogger(__name__)

CURVES_FILE = "curves.png"
FIGURE_WIDTH = 11.0  # inches, whatever the panels
PANEL_HEIGHT = 3.3  # inches per row of panels (up to three panels in a row; four as two rows of two)
DPI = 100


@dataclass(frozen=True)
class Panel:
    """One plot of the figure: metrics against the round; ``missing`` says why it is left out when no run logged it."""

    title: str
    ylabel: str
    metrics: tuple[tuple[str, str], ...]  # (metrics.jsonl key, line style)
    missing: str = "not logged by these runs"


PANELS = (
    Panel("kNN monitor accuracy", "accuracy", (("knn_accuracy", "-o"),)),
    Panel(
        "client loss: cluster (solid), rotation (dashed)", "loss",
        (("cluster_loss", "-"), ("rotation_loss", "--")),
        "clients send losses only with --report-client-metrics",
    ),
    Panel("ε spent by the worst-case client", "ε (cumulative)", (("privacy_epsilon", "-"),),
          "no ε: the mechanism has none (kanon, reps) or the method releases nothing"),
    Panel("round time", "seconds", (("round_seconds", "-"),)),
)


@dataclass(frozen=True)
class RunCurves:
    """A run's label, its logged rounds, and (for the figure's title) its configuration."""

    label: str
    rounds: list[dict[str, Any]]
    config: TrainConfig | None = None

    @classmethod
    def of(cls, run_dir: Path) -> RunCurves:
        """A run's curves; a finished run's untrained kNN accuracy is its kNN curve's round 0."""
        run = RunDirectory(run_dir)
        rounds = run.metrics()
        summary = run.path / "summary.json"
        if summary.is_file() and rounds and rounds[0]["round"] == 0 and rounds[0].get("knn_accuracy") is None:
            rounds[0] = {**rounds[0], "knn_accuracy": run.read_json("summary.json").get("knn_accuracy_init")}
        config = run.config()
        return cls(run_label(config), rounds, config)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """The rounds that logged a number for ``key``, and its values; none for a loss that is off (0 every round)."""
        points = [(m["round"], float(m[key])) for m in self.rounds if isinstance(m.get(key), (int, float))]
        if all(v == 0.0 for _, v in points) and key.endswith("_loss"):
            return [], []
        return [r for r, _ in points], [v for _, v in points]


def dataset_name(dataset: str) -> str:
    """``cifar10-dev`` for ``arrays:../data/cifar10-dev.npz``; a named dataset as it is."""
    file = arrays_file(dataset)
    return dataset if file is None else f"{file.stem} (arrays)"


def release_text(config: TrainConfig) -> str | None:
    """``ldp ε=1`` (``ldp ε=0.1/release`` for a fixed per-release epsilon), ``kanon``; None when nothing is released."""
    mechanism = config.release_mechanism
    if mechanism is None or (config.epsilon is None and config.epsilon_per_release is None):
        return mechanism
    return f"{mechanism} ε={config.epsilon:g}" if config.epsilon is not None else f"{mechanism} ε={config.epsilon_per_release:g}/release"


def mechanism_text(config: TrainConfig) -> str:
    """:func:`release_text`, ``none`` for a method that releases nothing; ``, DP-SGD`` when on."""
    return (release_text(config) or "none") + (", DP-SGD" if config.dp_sgd else "")


def curves_title(configs: list[TrainConfig]) -> str:
    """The dataset, method and mechanism the runs share; what differs is left to the legend."""
    parts = []
    for what, value_of in (("dataset", lambda c: dataset_name(c.dataset)), ("method", lambda c: c.method),
                           ("mechanism", mechanism_text)):
        values = list(dict.fromkeys(value_of(c) for c in configs))
        parts.append(f"{what} {values[0]}" if len(values) == 1 else f"{what}: see legend")
    if len(configs) == 1:
        parts.append(f"seed {configs[0].seed}")
    return " · ".join(parts)


def run_label(config: TrainConfig) -> str:
    """What tells runs apart in a legend: method, :func:`release_text`, DP-SGD, seed."""
    parts = [config.method, release_text(config), "DP-SGD" if config.dp_sgd else None, f"seed {config.seed}"]
    return ", ".join(part for part in parts if part is not None)


def fit_layout(fig: Any, **options: Any) -> None:
    """``fig.tight_layout`` without the warning when long labels leave it no room: under ``PYTHONWARNINGS=error`` it
    alone would stop a study with its results unwritten."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tight layout not applied", category=UserWarning)
        fig.tight_layout(**options)


def picture_path(path: Path, formats: dict[str, str]) -> Path:
    """Where a picture asked for at ``path`` goes (``.png`` when it has no extension); PrivfedError for an extension
    matplotlib cannot write, or a folder that does not exist."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise PrivfedError(f"cannot draw into {str(path)!r}: give a file name, e.g. curves.png")
    check_path(path, "the picture's path")
    if path.suffix == "":
        path = path.with_name(path.name + ".png")
    if path.suffix[1:].lower() not in formats:
        raise PrivfedError(f"cannot draw {path}: unknown picture type {path.suffix!r} (use .png, .pdf or .svg)")
    if not path.parent.is_dir():
        raise PrivfedError(f"cannot write {path}: the folder {path.parent} does not exist")
    return path


def panels_with_data(runs: list[RunCurves]) -> list[Panel]:
    """The :data:`PANELS` some run logged a number for: the others are left out of the picture, not drawn empty."""
    return [panel for panel in PANELS if any(run.series(key)[0] for run in runs for key, _ in panel.metrics)]


def plot_curves(runs: list[RunCurves], path: Path, *, title: str | None = None) -> Path:
    """Draws the :data:`PANELS` some run logged into one picture (PNG unless ``path`` says otherwise); returns where it went.

    The footer says why a panel is left out; the title defaults to what the runs share. Drawn on a
    :class:`matplotlib.figure.Figure`, never through pyplot, so the caller's backend (a notebook's) stays.

    Raises:
        PrivfedError: no run logged anything to draw, or the picture cannot be written at ``path``.
    """
    from privfed.extras import require

    require("matplotlib", feature=f"drawing {path.name}")

    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    drawn = panels_with_data(runs)
    if not drawn:
        raise PrivfedError(f"cannot draw {path}: the runs logged no round yet")
    left_out = [panel for panel in PANELS if panel not in drawn]
    columns = len(drawn) if len(drawn) <= 3 else 2
    rows = -(-len(drawn) // columns)
    legend = len(runs) > 1
    notes_height, legend_height = 0.17 * len(left_out), (0.22 * -(-len(runs) // 2) + 0.1 if legend else 0.0)
    footer = notes_height + legend_height + 0.05  # inches below the panels
    fig = Figure(figsize=(FIGURE_WIDTH, PANEL_HEIGHT * rows + 0.4 + footer))
    axes = list(fig.subplots(rows, columns, squeeze=False).flat)
    colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel in zip(axes, drawn):
        for index, run in enumerate(runs):
            for key, style in panel.metrics:
                rounds, values = run.series(key)
                if rounds:
                    label = run.label if key == panel.metrics[0][0] or len(panel.metrics) == 1 else None
                    ax.plot(rounds, values, style, color=colours[index % len(colours)], markersize=3, label=label)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("round", fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    notes = [f"not drawn: {panel.title} ({panel.missing})" for panel in left_out]
    fig.suptitle(title if title is not None else curves_title([r.config for r in runs if r.config is not None]), fontsize=10)
    bottom = footer / fig.get_figheight()
    if legend:
        handles, labels = fig.axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8,
                   bbox_to_anchor=(0.5, notes_height / fig.get_figheight()), frameon=False)
    if notes:
        fig.text(0.5, 0.01, "\n".join(notes), ha="center", va="bottom", fontsize=7, color="dimgray")
    fit_layout(fig, rect=(0, bottom, 1, 1))
    try:
        path = picture_path(path, fig.canvas.get_supported_filetypes())
        fig.savefig(path, dpi=DPI)
    except OSError as err:
        raise PrivfedError(f"cannot write {path}: {err.strerror or err}") from None
    return path


def save_run_curves(run_dir: RunDirectory) -> Path | None:
    """Writes ``curves.png`` for one run; a failure to draw is logged, never raised (the run's files are what matter)."""
    try:
        return plot_curves([RunCurves.of(run_dir.path)], run_dir.path / CURVES_FILE)
    except Exception as err:  # e.g. a broken matplotlib install: the run itself is complete
        logger.warning("could not draw %s: %s", run_dir.path / CURVES_FILE, err)
        return None
