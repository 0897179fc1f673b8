"""Server side of Orchestra, independent of any FL runtime.

Holds the global network and centroids and turns a round's aggregate into
the next global state: the mean model delta is applied, then the clients'
releases are clustered (or, per the run's method, :mod:`privfed.methods`:
random centroids drawn once, or none). How the mean delta was formed
(FedAvg or secure aggregation) is the runtime's business: the server never
needs one client's delta. A :class:`~mechanisms.base.SecureSumMechanism`
replaces the releases by one secure sum of the clients' shares, which it
turns into the next centroids itself; a
:class:`~mechanisms.base.TableReleaseMechanism` does the same from the sum of
its clients' tables in every training round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mechanisms.base import Release, SecureSumMechanism, TableRelease, TableReleaseMechanism
from privfed.methods import CLUSTERED, FIXED_RANDOM, ORCHESTRA, Method
from privfed.models.network import OrchestraNetwork
from privfed.orchestra.global_clustering import KMEANS, global_centroids, random_centroids
from privfed.orchestra.model_state import StateDict, apply_delta, load_shared_state, shared_state


@dataclass(frozen=True)
class SecureSum:
    """The unmasked sum of a secure-sum mechanism's shares, how many clients' shares it holds, and whose (client
    ids, ascending; empty where the runtime did not say)."""

    total: np.ndarray
    num_summed: int
    clients: tuple[int, ...] = ()


class OrchestraServer:
    """Global state and the per-round update rule."""

    def __init__(
        self, network: OrchestraNetwork, *, num_global_centroids: int, seed: int, method: Method = ORCHESTRA,
        global_clustering: str = KMEANS, cluster_temperature: float | None = None,
        aggregator: SecureSumMechanism | None = None, table_summing: TableReleaseMechanism | None = None,
    ) -> None:
        if aggregator is not None and table_summing is not None:
            raise ValueError("a run's centroids come from a secure sum or from summed tables, not both")
        self.aggregator = aggregator
        self.table_summing = table_summing
        self.network = network
        self.method = method
        self.num_global_centroids = num_global_centroids
        self.global_clustering = global_clustering
        self.cluster_temperature = cluster_temperature
        self.centroids: torch.Tensor | None = None
        #: False until round 0 (initialisation) is applied; training rounds follow.
        self.initialised = False
        self._generator = torch.Generator().manual_seed(seed)

    def global_state(self) -> StateDict:
        return shared_state(self.network)

    def generator_state(self) -> torch.Tensor:
        """The clustering generator's state, for a resume point (:mod:`privfed.run.resume`)."""
        return self._generator.get_state()

    def restore(self, *, network: StateDict, centroids: torch.Tensor | None, initialised: bool, generator: torch.Tensor) -> None:
        """Puts the server back where a resume point left it."""
        self.network.load_state_dict(network)
        self.centroids = None if centroids is None else centroids.clone()
        self.initialised = initialised
        self._generator.set_state(generator)

    def apply_round(
        self, mean_delta: StateDict | None, releases: list[Release], secure_sum: SecureSum | None = None, *,
        released: bool = True,
    ) -> dict[str, float]:
        """Applies the round's mean delta (None: the model stays) and updates the centroids.

        Orchestra re-clusters the releases, or has a secure-sum mechanism
        combine the sum of its shares (None: the sum halted, and the centroids
        stay; round 0 has none, so that run starts from random centroids); the
        fixed-centroid control draws its random centroids once, in round 0; a
        method without centroids has none.

        ``released`` False: a round without releases by the run's plan; a training round (the run's cadence
        skips it) then holds no release or share, and the centroids stay.

        Returns:
            Round statistics that are safe to log.
        """
        if not released and self.initialised:
            if releases or secure_sum is not None:
                raise ValueError("the round's cadence releases nothing, yet the round holds releases or a secure sum")
            if mean_delta is not None:
                load_shared_state(self.network, apply_delta(self.global_state(), mean_delta))
            return {}
        if self.aggregator is not None:
            if releases:
                raise ValueError(
                    f"mechanism {self.aggregator.name} shares into the secure sum, yet the round holds releases"
                )
        elif secure_sum is not None:
            raise ValueError("a secure sum of shares arrived, but the run's mechanism releases per client")
        elif self.method.releases and not releases:
            raise ValueError("a round needs at least one client release")
        elif releases and not self.method.releases:
            raise ValueError(f"method {self.method.name} releases nothing, yet the round holds releases")
        if mean_delta is not None:
            load_shared_state(self.network, apply_delta(self.global_state(), mean_delta))
        self.initialised = True
        # Every client's cells must be the same public ones: a secure-sum run starts from random centroids too.
        if self.centroids is None and (self.aggregator is not None or self.method.centroids == FIXED_RANDOM):
            self.centroids = random_centroids(self.num_global_centroids, self.network.projection_dim, self._generator)
        if self.aggregator is not None:
            if secure_sum is None:
                return {}
            previous, summed = self.centroids, secure_sum.num_summed
            assert previous is not None  # drawn above
            self.centroids = self.aggregator.combine(secure_sum.total, centroids=previous, num_summed=summed)
            moved = (self.centroids - previous).norm(dim=1) > 0
            return {"clients": float(summed), "moved_centroid_fraction": float(moved.float().mean())}
        if self.method.centroids != CLUSTERED:
            return {}
        if self.table_summing is not None and self.centroids is not None:
            return self._sum_tables(releases, self.table_summing)
        self.centroids = global_centroids(
            releases, self.num_global_centroids, previous=self.centroids, generator=self._generator,
            method=self.global_clustering, cluster_temperature=self.cluster_temperature,
        )
        vectors = sum(r.num_vectors for r in releases)
        stats = {"clients": float(len(releases)), "released_vectors": float(vectors)}
        if vectors:
            # Padding (weight 0) stands for no representation: a low fraction means the DP noise drowned the releases.
            stats["weighted_vector_fraction"] = sum(int((r.weights > 0).sum()) for r in releases) / vectors
        usage = _centroid_usage(releases, self.centroids)
        if usage is not None:
            stats["centroid_usage"] = usage
        return stats

    def _sum_tables(self, releases: list[Release], mechanism: TableReleaseMechanism) -> dict[str, float]:
        """A training round's step from the clients' tables, all over the centroids the server sent."""
        tables = [r.table for r in releases if isinstance(r, TableRelease)]
        if len(tables) != len(releases):
            raise ValueError(f"mechanism {mechanism.name} moves the centroids from tables, yet a release holds none")
        previous = self.centroids
        assert previous is not None  # the caller asked
        self.centroids = mechanism.combine_tables(tables, centroids=previous)
        moved = (self.centroids - previous).norm(dim=1) > 0
        return {
            "clients": float(len(releases)),
            "released_vectors": float(sum(r.num_vectors for r in releases)),
            "moved_centroid_fraction": float(moved.float().mean()),
        }


def _centroid_usage(releases: list[Release], centroids: torch.Tensor) -> float | None:
    """Fraction of global centroids nearest to some released vector (None: nothing released, as by honest ``kanon``
    clients with fewer than ``--kanon-min-k`` images); far below 1, the global clustering collapsed."""
    released = [r.vectors.float() for r in releases if r.num_vectors > 0]
    if not released:
        return None
    nearest = (torch.cat(released) @ centroids.T).argmax(dim=1)
    return float(nearest.unique().numel() / centroids.shape[0])

