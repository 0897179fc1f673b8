import itertools

import pytest
import torch
import torch.nn.functional as F

from mechanisms.clustering import (
    balanced_kmeans,
    equal_size_assignment,
    sinkhorn_kmeans,
    sinkhorn_knopp,
)


def unit(n: int, d: int, seed: int = 0) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


def test_sinkhorn_plan_has_requested_marginals():
    scores = torch.randn(50, 7, generator=torch.Generator().manual_seed(1)) * 5
    rows = torch.rand(50, generator=torch.Generator().manual_seed(2)) + 0.1
    plan = sinkhorn_knopp(scores, row_mass=rows, num_iters=300)
    assert torch.allclose(plan.sum(1), (rows / rows.sum()).double(), atol=1e-6)
    assert torch.allclose(plan.sum(0), torch.full((7,), 1 / 7, dtype=plan.dtype), atol=1e-6)


@pytest.mark.parametrize("n,k", [(128, 8), (125, 8), (9, 9), (30, 4)])
def test_equal_size_assignment_sizes_differ_by_at_most_one(n, k):
    x = unit(n, 16)
    sizes = torch.bincount(equal_size_assignment(x @ x[:k].T), minlength=k)
    assert sizes.sum() == n
    assert sizes.min() == n // k
    assert sizes.max() - sizes.min() <= 1


def test_equal_size_assignment_is_optimal_on_a_small_case():
    scores = torch.randn(6, 3, generator=torch.Generator().manual_seed(3))
    got = equal_size_assignment(scores)
    got_value = scores[torch.arange(6), got].sum()
    best = max(
        scores[torch.arange(6), torch.tensor(perm)].sum()
        for perm in set(itertools.permutations([0, 0, 1, 1, 2, 2]))
    )
    assert torch.isclose(got_value, best)


def test_equal_size_assignment_rejects_fewer_points_than_clusters():
    with pytest.raises(ValueError):
        equal_size_assignment(torch.zeros(3, 5))


def test_balanced_kmeans_returns_normalised_member_means():
    x = unit(100, 8)
    centroids, assignment = balanced_kmeans(x, 6, generator=torch.Generator().manual_seed(0))
    assert torch.bincount(assignment, minlength=6).min() == 100 // 6
    for j in range(6):
        expected = F.normalize(x[assignment == j].mean(0), dim=0)
        assert torch.allclose(centroids[j], expected, atol=1e-5)


def test_sinkhorn_kmeans_recovers_separated_clusters_with_equal_mass():
    g = torch.Generator().manual_seed(0)
    centres = unit(4, 32, seed=5)
    points = F.normalize(centres.repeat_interleave(40, 0) + 0.05 * torch.randn(160, 32, generator=g), dim=1)
    found = sinkhorn_kmeans(points, 4, generator=g)
    # every true centre has a found centre very close to it
    assert (centres @ found.T).max(dim=1).values.min() > 0.95
    assert torch.allclose(found.norm(dim=1), torch.ones(4), atol=1e-5)


def test_sinkhorn_kmeans_respects_weights():
    """A heavy point pulls a whole cluster's worth of mass: it gets a centre of its own."""
    g = torch.Generator().manual_seed(0)
    light = F.normalize(torch.tensor([[1.0, 0.0]]).repeat(10, 1) + 0.01 * torch.randn(10, 2, generator=g), dim=1)
    heavy = torch.tensor([[0.0, 1.0]])
    points = torch.cat([light, heavy])
    weights = torch.cat([torch.ones(10), torch.tensor([10.0])])
    found = sinkhorn_kmeans(points, 2, weights=weights, generator=g)
    assert (found @ heavy.T).max() > 0.99
