"""Server side: cluster every client's release into the global centroids."""

from __future__ import annotations

import torch

from mechanisms.base import Release
from mechanisms.clustering import sinkhorn_kmeans


def global_centroids(
    releases: list[Release],
    num_centroids: int,
    *,
    previous: torch.Tensor | None,
    generator: torch.Generator,
    temperature: float = 0.05,
    num_iters: int = 30,
) -> torch.Tensor:
    """Equal-mass spherical clustering of all released vectors.

    Each released vector weighs as many representations as it stands for
    (a ``kanon`` centroid of 16 members weighs 16, a raw representation 1), so
    releases of different sizes count consistently. Warm-starting from last
    round's centroids keeps the clustering stable between rounds.

    Raises:
        ValueError: if fewer vectors were released than centroids requested.
    """
    nonempty = [r for r in releases if r.num_vectors > 0]
    total = sum(r.num_vectors for r in nonempty)
    if total < num_centroids:
        raise ValueError(
            f"clients released {total} vectors, fewer than the {num_centroids} global centroids"
        )
    vectors = torch.cat([r.vectors.float() for r in nonempty])
    weights = torch.cat([r.weights.float() for r in nonempty])
    if weights.sum() <= 0:
        # Every release is padding (e.g. DP coresets too small to keep any
        # point): keep last round's centroids, or start from the padding.
        if previous is not None:
            return previous
        weights = torch.ones_like(weights)
    return sinkhorn_kmeans(
        vectors,
        num_centroids,
        weights=weights,
        init=previous,
        generator=generator,
        temperature=temperature,
        num_iters=num_iters,
    )
