"""The CLI's progress: what the library reports through callbacks, as rich bars on a terminal, plain lines otherwise."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

#: When this process reached privfed (the ``done`` line's wall time counts from here, imports and set-up included).
PROCESS_START = time.perf_counter()

def _round_line(event: dict[str, Any]) -> str:
    """One training round as the plain log shows it."""
    parts = [f"round {event['round']:>3}", f"clients {event['clients_completed']}/{event['clients_sampled']}"]
    for key, label, digits in (("loss", "loss", 4), ("knn_accuracy", "kNN", 4), ("privacy_epsilon", "eps", 3)):
        if event.get(key) is not None:
            parts.append(f"{label} {event[key]:.{digits}f}")
    parts.append(f"{event['round_seconds']:.1f}s")
    return "  ".join(parts)


class ProgressView:
    """Draws the library's progress callbacks: rich bars with an ETA on a terminal, plain lines in a log or pipe."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console

        self.console = console or Console()
        self.live = self.console.is_terminal
        self._bars: Progress | None = None
        self._tasks: dict[str, TaskID] = {}

    def echo(self, text: str) -> None:
        """A line above the bars (or the line itself, off a terminal)."""
        if self._bars is not None:
            self._bars.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self.console.file.write(text + "\n")
            self.console.file.flush()

    def step(self, stage: str, done: int, total: int, figures: dict[str, float] | None = None) -> None:
        """A stage's bar (decoder training, a probe's epochs, ...); nothing off a terminal."""
        if not self.live:
            return
        shown = "  ".join(f"{k} {v:.4f}" for k, v in (figures or {}).items())
        bars = self._started()
        task = self._tasks.get(stage)
        if task is None:
            task = self._tasks[stage] = bars.add_task(stage, total=total, figures=shown)
        bars.update(task, completed=done, total=total, figures=shown)
        if done >= total and not stage.endswith("rounds"):  # a run's bar stays until its done line
            bars.remove_task(task)
            del self._tasks[stage]

    def attack_step(self, stage: str, done: int, total: int, figures: dict[str, float]) -> None:
        """An attack's stage: a bar, or its plain line off a terminal (as `privfed attack` always printed)."""
        if self.live:
            self.step(stage, done, total, figures)
        else:
            shown = "  ".join(f"{k} {v:.4f}" for k, v in figures.items())
            self.echo(f"  {stage}: {done}/{total}  {shown}")

    def close(self) -> None:
        """Removes the bars (the lines printed above them stay)."""
        if self._bars is not None:
            self._bars.stop()
        self._bars = None
        self._tasks.clear()

    def _started(self) -> Progress:
        if self._bars is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bars = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[figures]}"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console, transient=True,
            )
            self._bars.start()
        return self._bars


class RoundProgress:
    """``privfed train``'s progress callback: a line per round (and a bar on a terminal), then the ``done`` line."""

    def __init__(self, view: ProgressView, *, lines: bool = True, rounds_done: int = 0, label: str = "rounds") -> None:
        self.view, self.lines, self.rounds_done, self.label = view, lines, rounds_done, label
        self.total = 0
        self.epsilon: float | None = None
        self.dp_sgd_epsilon: float | None = None

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "start":
            self._say(f"untrained encoder: kNN accuracy {event['knn_accuracy_init']:.4f}")
            self.total = event["rounds"]
            self.view.step(self.label, self.rounds_done, self.total)
        elif kind == "round":
            self.epsilon = event.get("privacy_epsilon", self.epsilon)
            self.dp_sgd_epsilon = event.get("privacy_dp_sgd_epsilon", self.dp_sgd_epsilon)
            self._say(_round_line(event))
            figures = {k: event[v] for k, v in (("kNN", "knn_accuracy"), ("eps", "privacy_epsilon")) if event.get(v) is not None}
            self.view.step(self.label, event["round"], self.total, figures)
        elif kind == "stop":
            self._say(f"stopping: {event['reason']}")
        elif kind == "finish":
            self.view.close()
            self._say(self.done_line(event))

    def done_line(self, event: dict[str, Any]) -> str:
        """The run's outcome: accuracy, rounds, the worst-off client's epsilon, wall time (the process's and the loop's)."""
        spent = [f"epsilon {e:.3f}" for e in (self.epsilon,) if e is not None]
        spent += [f"DP-SGD epsilon {e:.3f}" for e in (self.dp_sgd_epsilon,) if e is not None]
        privacy = f", {' and '.join(spent)} spent (worst-case client)" if spent else ""
        wall = time.perf_counter() - PROCESS_START
        ended = "done" if event.get("stop") is None else f"stopped ({event['stop']['cause']})"
        return (
            f"{ended}: kNN accuracy {event['knn_accuracy']:.4f} (untrained {event['knn_accuracy_init']:.4f}) "
            f"after {event['rounds']} rounds{privacy}, in {wall:.0f}s (training {event['wall_seconds']:.0f}s) "
            f"-> {event['run_dir']}"
        )

    def _say(self, text: str) -> None:
        if self.lines:
            self.view.echo(text)
