"""What a run asks of a mechanism's plan (:meth:`mechanisms.base.Mechanism.plan`); it imports nothing of mechanisms."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SecureSumSetup:
    """The run's SecAgg+ sums, as a secure-sum mechanism plans for them.

    Attributes:
        threshold: SecAgg+'s reconstruction threshold: the fewest shares any sum holds.
        modulus: SecAgg+'s modulus.
        max_summed: The most shares one sum can hold (the clients sampled per round).
    """

    threshold: int
    modulus: int
    max_summed: int


@dataclass(frozen=True)
class PlanRequest:
    """The run a mechanism plans for.

    Attributes:
        epsilon: What ``num_releases`` releases may spend together (None: the run gives no budget).
        delta: The delta every epsilon is quoted at.
        num_releases: How many releases ``epsilon`` covers.
        settings: The mechanism's own settings given by the run (the rest take the class's defaults).
        client_sizes: Every client's number of images.
        memory_size: Representations a client's memory keeps.
        dim: The representations' dimension.
        num_global_centroids: ``G``.
        secure_sum: The run's SecAgg+ sums (None: the run has no SecAgg+).
    """

    epsilon: float | None
    delta: float
    num_releases: int
    settings: Mapping[str, Any] = field(default_factory=dict)
    client_sizes: tuple[int, ...] = ()
    memory_size: int = 0
    dim: int = 0
    num_global_centroids: int = 0
    secure_sum: SecureSumSetup | None = None

    @property
    def secret_sample_rate(self) -> float:
        """A secret Poisson sample's rate that keeps ``memory_size`` rows of the median client, expected (at most 1).

        One rate for the run, so every client's release costs the same events.
        """
        return min(1.0, self.memory_size / max(statistics.median(self.client_sizes or (0,)), 1))
