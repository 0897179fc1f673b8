"""Server side: cluster every client's release into the global centroids.

Two procedures, chosen with ``--global-clustering``:

- ``kmeans`` (privfed's default): weighted, equal-mass Sinkhorn k-means on
  the sphere, warm-started from last round's centroids. It puts the
  centroids on the released vectors.
- ``official``: the authors' procedure. The centroids are parameters fitted
  by 500 SGD steps (lr 0.01, momentum 0.9, weight decay 1e-4, renormalised
  after every step) so that each vector's softmax assignment at the cluster
  loss's temperature matches, in cosine, Sinkhorn's balanced assignment. It
  starts from random unit vectors in round 0 and warm afterwards, and counts
  every released vector once. Its centroids stay near where they started,
  which makes the cluster targets softer at the same temperature (DESIGN §4).
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
    """The next global centroids from all released vectors.

    Each released vector weighs as many representations as it stands for
    (a ``kanon`` centroid of 16 members weighs 16, a raw representation 1);
    ``kmeans`` uses the weights, ``official`` counts each vector once. A
    vector of weight 0 (padding, e.g. of a DP release too noisy to keep a
    point) never counts, in either method. With fewer real vectors than
    ``G``, only the centroids nearest to them move (:func:`move_nearest`)
    and the rest keep last round's value; in round 0 the real vectors
    become centroids as they are and random unit vectors fill up to ``G``.
    Before this rule, padding counted towards ``G``: 3 real vectors among 400
    pulled all 64 centroids onto a handful of directions
    (``tests/orchestra/test_global_clustering.py``).

    Args:
        releases: This round's releases.
        num_centroids: ``G``.
        previous: Last round's centroids (None in round 0).
        generator: The server's generator (initialisation).
        method: :data:`KMEANS` or :data:`OFFICIAL`.
        cluster_temperature: The cluster loss's temperature ``tau``; ``official`` needs it.
        median_client_cap: ``kmeans`` only: scale each client's release down
            to at most the round's median release weight
            (:func:`median_capped_weights`), so that no client outweighs a
            typical one. Measured in ``benchmarks/client_influence.py``.

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

    Too few vectors to cluster cannot place ``G`` centroids, and fitting all
    of them to a few vectors would collapse the targets every client trains
    against onto those few directions.
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

    A robust variant of the weighted clustering: one client's share of the
    mass is at most a typical client's, whatever bound its mechanism's
    weights have (``ldp`` leaves room for noise, so a hostile ``ldp`` client
    may weigh about 19,500 at epsilon 1). Clients below the median keep their
    weights, so honest clients of the usual size are unchanged.
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


def assignment_mismatch(
    vectors: torch.Tensor, centroids: torch.Tensor, *, temperature: float, sharpness: float = 25.0, sinkhorn_iters: int = 100
) -> torch.Tensor:
    """The official procedure's loss: minus the mean cosine between balanced and softmax assignments.

    The balanced assignment is Sinkhorn's plan for the similarities scaled by
    ``sharpness`` (every centroid gets an equal share of the vectors); it is
    a fixed target. The softmax assignment at ``temperature`` carries the
    gradient to the centroids.
    """
    similarities = vectors @ centroids.T
    with torch.no_grad():
        balanced = sinkhorn_knopp(similarities * sharpness, num_iters=sinkhorn_iters).float()
    soft = F.softmax(similarities / temperature, dim=1)
    return -F.cosine_similarity(balanced, soft, dim=1).mean()


def fit_centroids(
    vectors: torch.Tensor,
    start: torch.Tensor,
    *,
    temperature: float,
    steps: int = 500,
    lr: float = 0.01,
    momentum: float = 0.9,
    weight_decay: float = 1e-4,
) -> torch.Tensor:
    """Unit centroids fitted from ``start`` by SGD on :func:`assignment_mismatch` (a fresh optimiser each call)."""
    vectors = F.normalize(vectors.float(), dim=1)
    centroids = F.normalize(start.float().clone(), dim=1).requires_grad_(True)
    optimizer = torch.optim.SGD([centroids], lr=lr, momentum=momentum, weight_decay=weight_decay)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        assignment_mismatch(vectors, centroids, temperature=temperature).backward()
        optimizer.step()
        with torch.no_grad():
            centroids.copy_(F.normalize(centroids, dim=1))
    return centroids.detach()
