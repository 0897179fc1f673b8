"""What one finished round hands from the runtime to the server-side driver.

The runtime (:mod:`privfed.federation.strategy`) fills it; the driver
(:mod:`privfed.run.driver`) logs it, charges the ledger and decides whether
to stop. Neither needs to know the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mechanisms.base import PrivacyEvent, Release


@dataclass(frozen=True)
class Rejection:
    """A reply the server dropped: which client's (None when its node was not asked this round) and why."""

    client: int | None
    reason: str


@dataclass(frozen=True)
class RoundReport:
    """One finished Orchestra round.

    Attributes:
        round: Orchestra round (0 initialises).
        sampled_clients: Client (partition) ids asked to take part, in order.
        completed: Clients whose reply was folded in.
        failures: ``sampled - completed``.
        seconds: Wall time of the round on the server.
        server_stats: The server's own statistics (global clustering,
            aggregation), safe to log.
        client_metrics: Each reply's numeric metrics.
        releases: ``(client id, release)`` for every reply.
        training_events: ``(client id, DP-SGD events)`` for every reply
            (empty events without DP-SGD and in round 0).
        rejected: Replies the server dropped, with the reason
            (:mod:`privfed.federation.reply_checks`).
        runtime_state: The runtime's own state after the round (client
            sampling, SecAgg+ scales), kept opaque in resume points
            (:mod:`privfed.run.resume`).
        unusable: Why no reply could be used (None when one could): the
            model stayed as it was, and the run stops with this reason.
        update_dropped: Why a training round applied no model update though
            replies arrived (a SecAgg+ overflow, halt or implausible sum);
            None when it applied one, and in round 0.
    """

    round: int
    completed: int
    failures: int
    seconds: float
    server_stats: dict[str, float]
    sampled_clients: tuple[int, ...] = ()
    client_metrics: list[dict[str, float]] = field(default_factory=list)
    releases: list[tuple[int, Release]] = field(default_factory=list)
    training_events: list[tuple[int, tuple[PrivacyEvent, ...]]] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    runtime_state: dict[str, Any] = field(default_factory=dict)
    unusable: str | None = None
    update_dropped: str | None = None

    @property
    def sampled(self) -> int:
        """Clients asked to take part."""
        return len(self.sampled_clients)
