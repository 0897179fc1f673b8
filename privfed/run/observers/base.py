"""What every round observer is: two hooks around the round's metrics line, called in a fixed order by the driver.

Hooks that charge, record, evaluate or decide a stop run before the line is written (and may add fields to it);
the resume point, which must come last, runs after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from privfed.orchestra.round_report import RoundReport


@dataclass(frozen=True)
class FinishedRound:
    """One finished round: what the runtime reported, and its ``metrics.jsonl`` line (``after_round`` may add to it)."""

    report: RoundReport
    metrics: dict[str, Any]


class RoundObserver:
    """One concern that runs after each round; override one hook or both (neither does anything by default)."""

    def after_round(self, finished: FinishedRound) -> None:
        """Runs before the round's metrics line is written."""

    def after_metrics(self, finished: FinishedRound) -> None:
        """Runs once the round's metrics line is written."""
