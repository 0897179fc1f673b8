"""What one finished round hands from the runtime (:mod:`privfed.federation.strategy`) to the driver
(:mod:`privfed.run.driver`), which logs it, charges the ledger and decides whether to stop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mechanisms.base import PrivacyEvent, Release
from privfed.orchestra.model_state import StateDict
from privfed.orchestra.server import SecureSum


@dataclass(frozen=True)
class Rejection:
    """A reply the server dropped: which client's (None when its node was not asked this round) and why."""

    client: int | None
    reason: str


@dataclass(frozen=True)
class RoundReport:
    """One finished Orchestra round.

    Attributes:
        server_stats: The server's own statistics (global clustering, aggregation), safe to log.
        runtime_state: The runtime's state after the round (client sampling, SecAgg+ scales), opaque in resume points.
        unusable: Why no reply could be used (None: one could); the model stays and the run stops.
        update_dropped: Why a training round applied no update though replies arrived (e.g. a SecAgg+ overflow).
        updates: Each accepted client's model delta as the server decoded it, in client order; None unless the
            runtime was asked to keep them (``--record-releases`` with ``--no-secagg``) and the round trained.
        secure_sum: The unmasked sum of a secure-sum mechanism's shares the server combined (None: none, or it halted).
        train: Whether clients were asked to train (False: an initialisation, which clients count as round 0 whatever
            its index, as the strategy repeats it until some reply of it is applied).
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
    updates: dict[int, StateDict] | None = None
    secure_sum: SecureSum | None = None
    train: bool = True

    @property
    def sampled(self) -> int:
        """Clients asked to take part."""
        return len(self.sampled_clients)
