"""The server's two global clusterings: privfed's k-means and the authors' SGD fit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mechanisms import Guarantee, Release
from privfed.config import GLOBAL_CLUSTERINGS
from privfed.orchestra.global_clustering import (
    KMEANS,
    OFFICIAL,
    assignment_mismatch,
    fit_centroids,
    global_centroids,
    random_centroids,
)

NONE = Guarantee(kind="none", statement="test")


def clustered(num_clusters: int = 4, per_cluster: int = 30, dim: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(num_clusters, dim, generator=g), dim=1)
    noise = 0.15 * torch.randn(num_clusters * per_cluster, dim, generator=g)
    return F.normalize(centres.repeat_interleave(per_cluster, 0) + noise, dim=1)


def releases(vectors: torch.Tensor, weights: torch.Tensor | None = None) -> list[Release]:
    return [Release(vectors, torch.ones(len(vectors)) if weights is None else weights, NONE)]


def test_the_config_offers_exactly_the_procedures_the_server_has():
    assert set(GLOBAL_CLUSTERINGS) == {KMEANS, OFFICIAL}


def test_the_official_fit_lowers_its_loss_and_keeps_unit_centroids():
    vectors, start = clustered(), random_centroids(8, 16, torch.Generator().manual_seed(1))
    fitted = fit_centroids(vectors, start, temperature=0.1)
    assert fitted.shape == (8, 16) and torch.allclose(fitted.norm(dim=1), torch.ones(8), atol=1e-5)
    before = assignment_mismatch(vectors, start, temperature=0.1).item()
    after = assignment_mismatch(vectors, fitted, temperature=0.1).item()
    assert after < before - 0.05


def test_official_centroids_stay_near_their_start_where_kmeans_moves_onto_the_data():
    """The documented difference (DESIGN §4): SGD centroids stay close to their random start."""
    vectors = clustered(num_clusters=8, dim=32)
    g = torch.Generator().manual_seed(2)
    start = random_centroids(8, 32, g)
    official = global_centroids(releases(vectors), 8, previous=start, generator=g, method=OFFICIAL, cluster_temperature=0.1)
    kmeans = global_centroids(releases(vectors), 8, previous=start, generator=g, method=KMEANS)
    moved_official = (official * start).sum(1).mean().item()
    moved_kmeans = (kmeans * start).sum(1).mean().item()
    assert moved_official > moved_kmeans + 0.2
    nearest = lambda c: (vectors @ c.T).max(dim=1).values.mean().item()
    assert nearest(kmeans) > nearest(official)


def test_official_round_zero_starts_from_the_servers_generator_and_is_reproducible():
    vectors = clustered()
    a = global_centroids(releases(vectors), 8, previous=None, generator=torch.Generator().manual_seed(5),
                         method=OFFICIAL, cluster_temperature=0.3)
    b = global_centroids(releases(vectors), 8, previous=None, generator=torch.Generator().manual_seed(5),
                         method=OFFICIAL, cluster_temperature=0.3)
    assert torch.equal(a, b)


def test_official_ignores_padding_but_counts_every_real_vector_once():
    vectors = clustered(num_clusters=2, per_cluster=20)
    padding = F.normalize(torch.ones(5, 16), dim=1)
    start = random_centroids(4, 16, torch.Generator().manual_seed(3))
    both = torch.cat([vectors, padding])
    weights = torch.cat([torch.full((40,), 7.0), torch.zeros(5)])
    with_padding = global_centroids(releases(both, weights), 4, previous=start, generator=torch.Generator(),
                                    method=OFFICIAL, cluster_temperature=0.1)
    without = fit_centroids(vectors, start, temperature=0.1)
    assert torch.allclose(with_padding, without, atol=1e-6)


def test_the_official_clustering_needs_the_temperature_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match="temperature"):
        global_centroids(releases(clustered()), 4, previous=None, generator=torch.Generator(), method=OFFICIAL)
    with pytest.raises(ValueError, match="unknown global clustering"):
        global_centroids(releases(clustered()), 4, previous=None, generator=torch.Generator(), method="magic")


def distinct_directions(centroids: torch.Tensor, cosine: float = 0.999) -> int:
    """How many centroids differ in direction (greedy: a centroid joins the first kept one it nearly equals)."""
    kept: list[torch.Tensor] = []
    for c in F.normalize(centroids.float(), dim=1):
        if all(float(c @ k) < cosine for k in kept):
            kept.append(c)
    return len(kept)


@pytest.mark.parametrize("method", [KMEANS, OFFICIAL])
@pytest.mark.parametrize("real", [1, 3, 10])
def test_a_few_real_vectors_among_padding_move_only_their_nearest_centroids(method, real):
    """400 released vectors, all but ``real`` of them weight-0 padding, G = 64: the collapse a review found.

    Before the fix, padding counted towards G and k-means pulled all 64
    centroids onto about ``real`` directions (1, 3 or 14 distinct).
    """
    g = torch.Generator().manual_seed(real)
    previous = random_centroids(64, 32, g)
    vectors = F.normalize(torch.randn(400, 32, generator=g), dim=1)
    weights = torch.zeros(400)
    weights[:real] = torch.arange(1, real + 1, dtype=torch.float32)
    centroids = global_centroids(releases(vectors, weights), 64, previous=previous, generator=g, method=method,
                                 cluster_temperature=0.1)
    assert distinct_directions(centroids) == 64
    unchanged = (centroids - previous).abs().amax(dim=1) == 0
    assert int(unchanged.sum()) >= 64 - real
    for vector in vectors[:real]:  # each real vector now has a centroid on or near it
        assert float((centroids @ vector).max()) > 0.5


def test_moved_centroids_are_the_weighted_means_of_the_real_vectors_nearest_them():
    previous = torch.eye(4)
    vectors = F.normalize(torch.tensor([[1.0, 0.2, 0, 0], [1.0, -0.1, 0, 0], [0, 0, 1.0, 0.3], [0.5, 0.5, 0.5, 0.5]]), dim=1)
    weights = torch.tensor([3.0, 1.0, 2.0, 0.0])  # the last is padding
    centroids = global_centroids(releases(vectors, weights), 4, previous=previous, generator=torch.Generator())
    assert torch.allclose(centroids[0], F.normalize(3 * vectors[0] + vectors[1], dim=0))
    assert torch.allclose(centroids[2], vectors[2])
    assert torch.equal(centroids[1], previous[1]) and torch.equal(centroids[3], previous[3])


def test_round_zero_with_only_padding_starts_from_random_centroids():
    vectors = F.normalize(torch.randn(100, 8, generator=torch.Generator().manual_seed(1)), dim=1)
    centroids = global_centroids(releases(vectors, torch.zeros(100)), 16, previous=None,
                                 generator=torch.Generator().manual_seed(7))
    assert torch.equal(centroids, random_centroids(16, 8, torch.Generator().manual_seed(7)))
