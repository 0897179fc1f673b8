"""Server side of Orchestra, independent of any FL runtime.

Holds the global network and centroids and turns a round's client updates
into the next global state: FedAvg of the model deltas, then clustering of
everything the clients released.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mechanisms.base import Release
from privfed.models.network import OrchestraNetwork
from privfed.orchestra.global_clustering import global_centroids
from privfed.orchestra.model_state import (
    StateDict,
    apply_delta,
    load_shared_state,
    shared_state,
    weighted_mean,
)


@dataclass(frozen=True)
class ReceivedUpdate:
    """One client's reply as the server sees it."""

    delta: StateDict | None
    release: Release
    num_samples: int


class OrchestraServer:
    """Global state and the per-round update rule."""

    def __init__(
        self, network: OrchestraNetwork, *, num_global_centroids: int, seed: int
    ) -> None:
        self.network = network
        self.num_global_centroids = num_global_centroids
        self.centroids: torch.Tensor | None = None
        self._generator = torch.Generator().manual_seed(seed)

    def global_state(self) -> StateDict:
        return shared_state(self.network)

    def apply_round(self, updates: list[ReceivedUpdate]) -> dict[str, float]:
        """Aggregates the deltas (when any) and re-clusters the releases.

        Returns:
            Round statistics that are safe to log.
        """
        if not updates:
            raise ValueError("a round needs at least one client update")
        trained = [u for u in updates if u.delta is not None]
        if trained:
            mean_delta = weighted_mean(
                [u.delta for u in trained], [float(u.num_samples) for u in trained]
            )
            load_shared_state(self.network, apply_delta(self.global_state(), mean_delta))
        releases = [u.release for u in updates]
        self.centroids = global_centroids(
            releases,
            self.num_global_centroids,
            previous=self.centroids,
            generator=self._generator,
        )
        ks = [r.guarantee.k for r in releases if r.guarantee.k is not None and r.num_vectors > 0]
        stats = {
            "clients": float(len(updates)),
            "released_vectors": float(sum(r.num_vectors for r in releases)),
            "centroid_usage": _centroid_usage(releases, self.centroids),
        }
        if ks:
            stats["min_k"] = float(min(ks))
        return stats


def _centroid_usage(releases: list[Release], centroids: torch.Tensor) -> float:
    """Fraction of global centroids that are the nearest one to some released vector.

    A value far below 1 means the global clustering collapsed onto few clusters.
    """
    vectors = torch.cat([r.vectors.float() for r in releases if r.num_vectors > 0])
    nearest = (vectors @ centroids.T).argmax(dim=1)
    return float(nearest.unique().numel() / centroids.shape[0])

