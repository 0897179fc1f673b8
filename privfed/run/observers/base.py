"""What every round observer is: two hooks around the round's metrics line.

The driver (:class:`privfed.run.driver.RunDriver`) hands each finished round
to its observers in a fixed order. The metrics line is the pivot: hooks that
charge, record, evaluate or decide a stop run before it is written (and may
add fields to it); the resume point, which must come last, runs after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from privfed.orchestra.round_report import RoundReport


@dataclass(frozen=True)
class FinishedRound:
    """One finished round as the observers see it.

    Attributes:
        report: What the runtime reported.
        metrics: The round's ``metrics.jsonl`` line; ``after_round`` hooks may add fields, in order.
    """

    report: RoundReport
    metrics: dict[str, Any]


class RoundObserver:
    """One concern that runs after each round; override one hook or both (neither does anything by default)."""

    def after_round(self, finished: FinishedRound) -> None:
        """Runs before the round's metrics line is written; may add to ``finished.metrics``."""

    def after_metrics(self, finished: FinishedRound) -> None:
        """Runs once the round's metrics line is written."""
