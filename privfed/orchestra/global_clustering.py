"""Server side: cluster every client's release into the global centroids (``--global-clustering``).

``kmeans`` (the default): weighted equal-mass Sinkhorn k-means, warm-started,
puts the centroids on the released vectors. ``official`` (the authors'): SGD
fits the centroids so that each vector's softmax assignment matches
Sinkhorn's balanced one; they stay near where they started, which softens the
cluster targets at the same temperature (DESIGN §4).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mechanisms.base import Release
from mechanisms.clustering import sinkhorn_kmeans, sinkhorn_knopp

#: ``--global-clustering`` choices (``privfed.config`` lists the same names).
KMEANS = "kmeans"
OFFICIAL = "official"


def global_centroids(
    releases: list[Release],
    num_centroids: int,
    *,
    previous: torch.Tensor | None,
    generator: torch.Generator,
    method: str = KMEANS,
    cluster_temperature: float | None = None,
    median_client_cap: bool = False,
) -> torch.Tensor:
    """The next ``G = num_centroids`` global centroids from all released vectors.

    ``kmeans`` weighs each vector by the representations it stands for, ``official`` counts each once; padding
    (weight 0) never counts. With fewer real vectors than ``G``, only the nearest centroids move
    (:func:`move_nearest`), or in round 0 random ones fill up. ``median_client_cap``
    (:func:`median_capped_weights`) changes ``kmeans`` only.
    """
    nonempty = [r for r in releases if r.num_vectors > 0]
    dim = nonempty[0].vectors.shape[1] if nonempty else releases[0].vectors.shape[1]
    vectors = torch.cat([r.vectors.float() for r in nonempty]) if nonempty else torch.zeros(0, dim)
    weights = (
        torch.cat(median_capped_weights(nonempty) if median_client_cap else [r.weights.float() for r in nonempty])
        if nonempty
        else torch.zeros(0)
    )
    real = weights > 0
    vectors, weights = F.normalize(vectors[real], dim=1), weights[real]
    if vectors.shape[0] < num_centroids:
        if previous is not None:
            return move_nearest(previous, vectors, weights)
        return torch.cat([vectors, random_centroids(num_centroids - vectors.shape[0], dim, generator)])
    if method == KMEANS:
        return sinkhorn_kmeans(vectors, num_centroids, weights=weights, init=previous, generator=generator,
                               temperature=0.05, num_iters=30)
    if method == OFFICIAL:
        if cluster_temperature is None:
            raise ValueError("the official global clustering needs the cluster loss's temperature")
        start = previous if previous is not None else random_centroids(num_centroids, vectors.shape[1], generator)
        return fit_centroids(vectors, start, temperature=cluster_temperature)
    raise ValueError(f"unknown global clustering {method!r} (choose from {KMEANS}, {OFFICIAL})")


def move_nearest(previous: torch.Tensor, vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each previous centroid that is some vector's nearest moves to their weighted mean; the others stay.

    Fitting all ``G`` to a few vectors would collapse every client's targets onto those few directions.
    """
    centroids = previous.clone()
    if vectors.shape[0] == 0:
        return centroids
    nearest = (vectors @ F.normalize(previous.float(), dim=1).T).argmax(dim=1)
    for index in nearest.unique():
        mine = nearest == index
        centroids[index] = F.normalize((weights[mine, None] * vectors[mine]).sum(dim=0), dim=0).to(centroids.dtype)
    return centroids


def median_capped_weights(releases: list[Release]) -> list[torch.Tensor]:
    """Each release's weights, scaled down where their total exceeds the median release's total.

    No client outweighs a typical one, whatever bound its mechanism's weights have (a hostile ``ldp`` client
    may weigh about 19,500 at epsilon 1).
    """
    totals = torch.stack([r.weights.double().sum() for r in releases])
    median = float(totals.median())
    return [
        (r.weights.double() * (median / float(t)) if float(t) > median else r.weights.double()).float()
        for r, t in zip(releases, totals)
    ]


def random_centroids(num_centroids: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """``[G, D]`` unit vectors drawn uniformly on the sphere."""
    return F.normalize(torch.randn(num_centroids, dim, generator=generator), dim=1)


def assignment_mismatch(vectors: torch.Tensor, centroids: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """The official procedure's loss: minus the mean cosine between balanced and softmax assignments.

    The balanced one, Sinkhorn's plan for the similarities times 25, is a
    fixed target; the softmax at ``temperature`` carries the gradient.
    """
    similarities = vectors @ centroids.T
    with torch.no_grad():
        balanced = sinkhorn_knopp(similarities * 25.0, num_iters=100).float()
    soft = F.softmax(similarities / temperature, dim=1)
    return -F.cosine_similarity(balanced, soft, dim=1).mean()


def fit_centroids(vectors: torch.Tensor, start: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """Unit centroids fitted from ``start`` by 500 SGD steps on :func:`assignment_mismatch` (a fresh optimiser)."""
    vectors = F.normalize(vectors.float(), dim=1)
    centroids = F.normalize(start.float().clone(), dim=1).requires_grad_(True)
    optimizer = torch.optim.SGD([centroids], lr=0.01, momentum=0.9, weight_decay=1e-4)
    for _ in range(500):
        optimizer.zero_grad(set_to_none=True)
        assignment_mismatch(vectors, centroids, temperature=temperature).backward()
        optimizer.step()
        with torch.no_grad():
            centroids.copy_(F.normalize(centroids, dim=1))
    return centroids.detach()
