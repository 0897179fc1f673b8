import pytest
import torch
import torch.nn.functional as F

from mechanisms import create_mechanism
from mechanisms.clustering import balanced_kmeans


def reps(n: int, d: int = 32, seed: int = 0) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


@pytest.mark.parametrize("n,L,released", [(128, 8, 8), (100, 8, 8), (40, 8, 8), (17, 4, 3), (8, 8, 1), (39, 8, 7)])
def test_every_centroid_averages_at_least_min_k_representations(n, L, released):
    """L centroids when n >= 5 L; fewer, of at least 5 each, below that (n = L releases one)."""
    x = reps(n)
    release = create_mechanism("kanon").release(x, num_centroids=L, generator=torch.Generator().manual_seed(1))
    assert release.num_vectors == released
    k = n // released
    assert k >= 5
    assert release.weights.min() >= k
    assert release.weights.sum() == n
    assert release.guarantee.kind == "k-anonymity" and release.guarantee.k == k
    # Rebuild the clustering from the same seed: each centroid is the mean of its members.
    _, assignment = balanced_kmeans(x, released, generator=torch.Generator().manual_seed(1))
    for j in range(released):
        members = x[assignment == j]
        assert len(members) >= k
        assert torch.allclose(release.vectors[j], F.normalize(members.mean(0), dim=0), atol=1e-5)


def test_no_released_centroid_is_a_raw_representation():
    x = reps(128)
    release = create_mechanism("kanon").release(x, num_centroids=8, generator=torch.Generator().manual_seed(0))
    assert (release.vectors @ x.T).max() < 0.999


@pytest.mark.parametrize("n,min_k", [(4, 5), (1, 5), (9, 10)])
def test_fewer_images_than_min_k_release_nothing(n, min_k):
    x = reps(n)
    release = create_mechanism("kanon", min_k=min_k).release(x, num_centroids=8, generator=torch.Generator().manual_seed(0))
    assert release.num_vectors == 0
    assert release.guarantee.k == 0


def test_min_k_is_a_setting_and_one_is_refused():
    x = reps(24)
    release = create_mechanism("kanon", min_k=12).release(x, num_centroids=8, generator=torch.Generator().manual_seed(0))
    assert release.num_vectors == 2 and release.weights.min() >= 12
    with pytest.raises(ValueError, match="min_k"):
        create_mechanism("kanon", min_k=1)
