"""K-anonymous release: equal-size spherical k-means centroids of at least ``min_k`` images each.

The clusters are equal-size exactly, by a linear assignment of points to
cluster slots (:func:`mechanisms.clustering.balanced_kmeans`; the official
code balances them approximately with Sinkhorn-Knopp), so no cluster is ever
empty and, unlike the official code, none is replaced by a raw representation.

The client hands a mechanism one representation per distinct image
(:class:`privfed.orchestra.memory.RepresentationMemory` keeps the latest view
of each), so each centroid is the normalised mean of at least ``k`` distinct
images' representations, and the server cannot tell which of them any single
vector came from. This is k-anonymity of the released vectors, not
differential privacy: a centroid is a deterministic function of its members,
and an image far from the others moves it.

``k`` is never below ``min_k``: a client with fewer than ``L * min_k`` images
releases ``floor(n / min_k)`` centroids, one with fewer than ``min_k`` nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from mechanisms.base import K_ANONYMITY, Guarantee, Release, ReleaseMechanism
from mechanisms.clustering import balanced_kmeans
from mechanisms.planning import PlanRequest
from mechanisms.registry import register_mechanism

#: Smallest anonymity set a centroid may have unless the run asks otherwise.
DEFAULT_MIN_K = 5


@register_mechanism
class KAnonymousCentroids(ReleaseMechanism):
    """Equal-size clustering so each centroid hides at least ``min_k`` images."""

    name = "kanon"
    description = "up to L equal-size spherical k-means centroids; each averages >= k >= min_k distinct images"
    guarantee_kind = K_ANONYMITY
    #: ``min_k``: the run's smallest anonymity set (``--kanon-min-k``).
    settings: ClassVar[Mapping[str, Any]] = MappingProxyType({"min_k": DEFAULT_MIN_K})

    def __init__(self, *, min_k: int = DEFAULT_MIN_K, num_iters: int = 10) -> None:
        if min_k < 2:
            raise ValueError(f"min_k must be at least 2 (a centroid of one image is that image), got {min_k}")
        self.min_k = min_k
        self.num_iters = num_iters

    @classmethod
    def planned_parameters(cls, request: PlanRequest, settings: Mapping[str, Any]) -> dict[str, Any]:
        """``min_k``, refused when no client's memory holds that many images (no centroid could be released)."""
        largest = min(max(request.client_sizes, default=0), request.memory_size)
        min_k = settings.get("min_k", DEFAULT_MIN_K)
        if largest < min_k:
            raise ValueError(
                f"no client holds min_k ({min_k}) images in its memory (the most is {largest}), so it "
                "could release no centroid: use fewer clients, more data, a larger --memory-size or a lower --kanon-min-k"
            )
        return {"min_k": min_k}

    def num_released(self, *, num_reps: int, num_centroids: int) -> int:
        """How many centroids ``num_reps`` images allow: ``L``, or fewer so that each keeps ``min_k``."""
        return min(num_centroids, num_reps // self.min_k)

    def guarantee(self, *, num_reps: int, num_centroids: int) -> Guarantee:
        released = self.num_released(num_reps=num_reps, num_centroids=num_centroids)
        k = num_reps // released if released else 0
        statement = (
            f"Each released centroid is the mean of the representations of at least {k} distinct images "
            "of the client; no single representation is released."
            if released else f"Nothing is released: fewer than {self.min_k} images."
        )
        return Guarantee(kind=K_ANONYMITY, statement=statement, k=k)

    def release(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> Release:
        return self.release_with_members(reps, num_centroids=num_centroids, generator=generator)[0]

    def release_with_members(
        self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
    ) -> tuple[Release, torch.Tensor]:
        """The centroids, and each row's cluster (``-1`` for every row when nothing is released)."""
        n, dim = reps.shape
        guarantee = self.guarantee(num_reps=n, num_centroids=num_centroids)
        released = self.num_released(num_reps=n, num_centroids=num_centroids)
        if released == 0:
            empty = torch.zeros(0, dim, dtype=reps.dtype)
            return Release(empty, torch.zeros(0), guarantee, metrics={"skipped": 1.0}), torch.full((n,), -1)
        centroids, assignment = balanced_kmeans(reps, released, generator=generator, num_iters=self.num_iters)
        sizes = torch.bincount(assignment, minlength=released).float()
        release = Release(
            centroids.to(reps.dtype), sizes.cpu(), guarantee, metrics={"min_cluster_size": float(sizes.min())}
        )
        return release, assignment.cpu()
