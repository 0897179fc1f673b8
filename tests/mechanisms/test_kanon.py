import pytest
import torch
import torch.nn.functional as F

from mechanisms import create_mechanism
from mechanisms.clustering import balanced_kmeans


def reps(n: int, d: int = 32, seed: int = 0) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


@pytest.mark.parametrize("n,L", [(128, 8), (100, 8), (17, 4), (8, 8)])
def test_every_centroid_averages_at_least_floor_n_over_L_representations(n, L):
    x = reps(n)
    release = create_mechanism("kanon").release(x, num_centroids=L, generator=torch.Generator().manual_seed(1))
    assert release.num_vectors == L
    assert release.weights.min() >= n // L
    assert release.weights.sum() == n
    assert release.guarantee.kind == "k-anonymity" and release.guarantee.k == n // L
    # Rebuild the clustering from the same seed: each centroid is the mean of its members.
    _, assignment = balanced_kmeans(x, L, generator=torch.Generator().manual_seed(1))
    for j in range(L):
        members = x[assignment == j]
        assert len(members) >= n // L
        assert torch.allclose(release.vectors[j], F.normalize(members.mean(0), dim=0), atol=1e-5)


def test_no_released_centroid_is_a_raw_representation():
    x = reps(128)
    release = create_mechanism("kanon").release(x, num_centroids=8, generator=torch.Generator().manual_seed(0))
    assert (release.vectors @ x.T).max() < 0.999


def test_too_few_representations_release_nothing():
    x = reps(5)
    release = create_mechanism("kanon").release(x, num_centroids=8, generator=torch.Generator().manual_seed(0))
    assert release.num_vectors == 0
    assert release.guarantee.k == 0
