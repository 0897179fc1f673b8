"""Equal-size clustering on the unit sphere, shared by clients and server: equal sizes keep a centroid from
being a handful of representations, and the global centroids from collapsing onto a few dense regions."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment


def sinkhorn_knopp(
    scores: torch.Tensor,
    *,
    row_mass: torch.Tensor | None = None,
    num_iters: int = 100,
) -> torch.Tensor:
    """``[n, k]`` entropic transport plan for ``[n, k]`` logits: rows carry ``row_mass`` (uniform if omitted),
    columns equal mass, total 1. In the log domain, so sharp scores stay finite."""
    n, k = scores.shape
    scores = scores.double()
    if row_mass is None:
        row_mass = torch.full((n,), 1.0 / n, dtype=scores.dtype, device=scores.device)
    log_r = torch.log(row_mass.to(scores) / row_mass.sum())
    col_mass = torch.full((k,), 1.0 / k, dtype=scores.dtype, device=scores.device)
    log_c = torch.log(col_mass / col_mass.sum())
    u = torch.zeros(n, dtype=scores.dtype, device=scores.device)
    v = torch.zeros(k, dtype=scores.dtype, device=scores.device)
    for _ in range(num_iters):
        u = log_r - torch.logsumexp(scores + v[None, :], dim=1)
        v = log_c - torch.logsumexp(scores + u[:, None], dim=0)
    return torch.exp(scores + u[:, None] + v[None, :])


def equal_size_assignment(scores: torch.Tensor) -> torch.Tensor:
    """``[n]`` cluster per point maximising the total ``[n, k]`` score, each of ``floor(n/k)`` points or one more:
    a linear assignment to slots, ``floor(n/k)`` mandatory ones (a bonus keeps them filled) and one optional each."""
    n, k = scores.shape
    if n < k:
        raise ValueError(f"need at least as many points as clusters, got {n} < {k}")
    base = n // k
    s = scores.detach().double().cpu().numpy()
    s = s - s.min()  # non-negative so the bonus below dominates
    bonus = (s.max() + 1.0) * n
    mandatory = np.repeat(s + bonus, base, axis=1) if base > 0 else np.empty((n, 0))
    optional = s if n % k else np.empty((n, 0))
    slot_scores = np.concatenate([mandatory, optional], axis=1)
    slot_cluster = np.concatenate(
        [np.repeat(np.arange(k), base), np.arange(k) if n % k else np.empty(0, dtype=int)]
    )
    rows, cols = linear_sum_assignment(slot_scores, maximize=True)
    assignment = np.empty(n, dtype=np.int64)
    assignment[rows] = slot_cluster[cols]
    return torch.from_numpy(assignment).to(scores.device)


def _kmeans_plus_plus_init(
    x: torch.Tensor, weights: torch.Tensor, k: int, generator: torch.Generator
) -> torch.Tensor:
    """Spread initial centres with k-means++ seeding on cosine distance."""
    n = x.shape[0]
    first = int(torch.multinomial(weights.cpu().double(), 1, generator=generator).item())
    centres = [x[first]]
    min_dist = (1.0 - x @ x[first]).clamp_min(0).cpu().double()
    for _ in range(1, k):
        probs = min_dist * weights.cpu().double()
        if probs.sum() <= 0:  # all points already coincide with a centre
            probs = torch.ones(n, dtype=torch.float64)
        nxt = int(torch.multinomial(probs, 1, generator=generator).item())
        centres.append(x[nxt])
        min_dist = torch.minimum(min_dist, (1.0 - x @ x[nxt]).clamp_min(0).cpu().double())
    return torch.stack(centres)


def balanced_kmeans(
    x: torch.Tensor,
    num_clusters: int,
    *,
    generator: torch.Generator,
    num_iters: int = 10,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spherical k-means of ``[n, D]`` unit vectors with equal cluster sizes (±1), seeded from a CPU ``generator``.

    Returns ``[k, D]`` unit-norm member means and the ``[n]`` cluster of each point.
    """
    n = x.shape[0]
    if n < num_clusters:
        raise ValueError(f"need at least {num_clusters} points, got {n}")
    x = x.float()
    weights = torch.ones(n)
    centroids = _kmeans_plus_plus_init(x, weights, num_clusters, generator)
    assignment = torch.zeros(n, dtype=torch.long, device=x.device)
    for step in range(num_iters):
        new_assignment = equal_size_assignment(x @ centroids.T)
        centroids = cluster_means(x, new_assignment, num_clusters)
        if step > 0 and torch.equal(new_assignment, assignment):
            break
        assignment = new_assignment
    return centroids, new_assignment


def cluster_means(x: torch.Tensor, assignment: torch.Tensor, k: int) -> torch.Tensor:
    """Unit-norm mean of each cluster's members (clusters must be non-empty)."""
    sums = torch.zeros(k, x.shape[1], dtype=x.dtype, device=x.device)
    sums.index_add_(0, assignment, x)
    return F.normalize(sums, dim=1)


def sinkhorn_kmeans(
    x: torch.Tensor,
    num_clusters: int,
    *,
    weights: torch.Tensor | None = None,
    init: torch.Tensor | None = None,
    generator: torch.Generator,
    temperature: float = 0.05,
    num_iters: int = 30,
) -> torch.Tensor:
    """``[k, D]`` unit centres of soft spherical k-means on ``[n, D]`` unit vectors, clusters of equal weighted mass.

    Each step moves the centres to the means of a Sinkhorn plan whose rows carry ``weights``; ``init`` (e.g.
    last round's) replaces k-means++ seeding.
    """
    n = x.shape[0]
    if n < num_clusters:
        raise ValueError(f"need at least {num_clusters} points to form as many clusters, got {n}")
    x = x.float()
    w = torch.ones(n, device=x.device) if weights is None else weights.float().to(x.device)
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    if init is None:
        centres = _kmeans_plus_plus_init(x, w, num_clusters, generator).to(x.device)
    else:
        centres = F.normalize(init.float().to(x.device), dim=1)
    for _ in range(num_iters):
        plan = sinkhorn_knopp((x @ centres.T) / temperature, row_mass=w).float()
        centres = F.normalize(plan.T @ x, dim=1)
    return centres
