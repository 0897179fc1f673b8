"""``curves.png``: a run's round-by-round figures as a picture, alone or overlaid with other runs.

Every run writes one next to its ``summary.json``; ``privfed plot`` overlays
several runs, labelled by what tells them apart (method, mechanism, epsilon,
seed). The figures come from ``metrics.jsonl`` only, so any finished,
stopped or still-running run can be drawn.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privfed.config import TrainConfig
from privfed.errors import PrivfedError
from privfed.runs import RunDirectory

logger = logging.getLogger(__name__)

CURVES_FILE = "curves.png"
FIGURE_SIZE = (11.0, 7.0)  # inches
DPI = 100


@dataclass(frozen=True)
class Panel:
    """One plot of the figure: metrics against the round, drawn with the given line styles; ``missing`` says why
    a panel no run logged is empty."""

    title: str
    metrics: tuple[tuple[str, str], ...]  # (metrics.jsonl key, line style)
    missing: str = "not logged by these runs"


PANELS = (
    Panel("kNN accuracy", (("knn_accuracy", "-o"),)),
    Panel(
        "loss: cluster (solid), rotation (dashed)",
        (("cluster_loss", "-"), ("rotation_loss", "--")),
        "not logged: clients send losses only with --report-client-metrics",
    ),
    Panel("epsilon spent by the worst-case client", (("privacy_epsilon", "-"),)),
    Panel("round time (s)", (("round_seconds", "-"),)),
)


@dataclass(frozen=True)
class RunCurves:
    """A run's label and its logged rounds."""

    label: str
    rounds: list[dict[str, Any]]

    @classmethod
    def of(cls, run_dir: Path) -> RunCurves:
        """A run's curves; a finished run's untrained kNN accuracy is its kNN curve's round 0."""
        run = RunDirectory(run_dir)
        rounds = run.metrics()
        summary = run.path / "summary.json"
        if summary.is_file() and rounds and rounds[0]["round"] == 0 and rounds[0].get("knn_accuracy") is None:
            rounds[0] = {**rounds[0], "knn_accuracy": run.read_json("summary.json").get("knn_accuracy_init")}
        return cls(run_label(run.config()), rounds)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """The rounds that logged ``key`` (with a number), and its values; none for a term that is off
        (a loss logged as exactly 0 every round, e.g. rotpred's cluster loss)."""
        points = [(m["round"], float(m[key])) for m in self.rounds if isinstance(m.get(key), (int, float))]
        if all(v == 0.0 for _, v in points) and key.endswith("_loss"):
            return [], []
        return [r for r, _ in points], [v for _, v in points]


def run_label(config: TrainConfig) -> str:
    """What tells runs apart in a legend: method, mechanism (with a DP mechanism's total epsilon), DP-SGD, seed."""
    parts = [config.method]
    mechanism = config.release_mechanism
    if mechanism is not None and config.epsilon is not None:
        parts.append(f"{mechanism} eps={config.epsilon:g}")
    elif mechanism is not None:
        parts.append(mechanism)
    if config.dp_sgd:
        parts.append("DP-SGD")
    parts.append(f"seed {config.seed}")
    return ", ".join(parts)


def picture_path(path: Path, formats: dict[str, str]) -> Path:
    """Where a picture asked for at ``path`` goes: a name without an extension gets ``.png``, as matplotlib gives it.

    Raises:
        PrivfedError: for an extension matplotlib cannot write, or a folder that does not exist.
    """
    path = Path(path)
    if path.suffix == "":
        path = path.with_name(path.name + ".png")
    if path.suffix[1:].lower() not in formats:
        raise PrivfedError(f"cannot draw {path}: unknown picture type {path.suffix!r} (use .png, .pdf or .svg)")
    if not path.parent.is_dir():
        raise PrivfedError(f"cannot write {path}: the folder {path.parent} does not exist")
    return path


def plot_curves(runs: list[RunCurves], path: Path, *, title: str | None = None) -> Path:
    """Draws :data:`PANELS` for every run into one picture (PNG unless ``path`` says otherwise); returns where it went.

    A panel no run logged says so.

    Raises:
        PrivfedError: when the picture cannot be written at ``path`` (see :func:`picture_path`).
    """
    from privfed.extras import require

    require("matplotlib", feature=f"drawing {path.name}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=FIGURE_SIZE, squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel in zip(axes.flat, PANELS):
        drawn = False
        for index, run in enumerate(runs):
            for key, style in panel.metrics:
                rounds, values = run.series(key)
                if rounds:
                    label = run.label if key == panel.metrics[0][0] or len(panel.metrics) == 1 else None
                    ax.plot(rounds, values, style, color=colours[index % len(colours)], markersize=3, label=label)
                    drawn = True
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("round", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if not drawn:
            ax.text(0.5, 0.5, panel.missing, ha="center", va="center", transform=ax.transAxes, fontsize=8)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if not handles:
        handles, labels = axes.flat[1].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06 if handles else 0, 1, 1))
    try:
        path = picture_path(path, fig.canvas.get_supported_filetypes())
        fig.savefig(path, dpi=DPI)
    except OSError as err:
        raise PrivfedError(f"cannot write {path}: {err.strerror or err}") from None
    finally:
        plt.close(fig)
    return path


def save_run_curves(run_dir: RunDirectory) -> Path | None:
    """Writes ``curves.png`` for one run; a failure to draw is logged, never raised (the run's files are what matter)."""
    try:
        return plot_curves([RunCurves.of(run_dir.path)], run_dir.path / CURVES_FILE, title=run_dir.path.name)
    except Exception as err:  # e.g. a broken matplotlib install: the run itself is complete
        logger.warning("could not draw %s: %s", run_dir.path / CURVES_FILE, err)
        return None
