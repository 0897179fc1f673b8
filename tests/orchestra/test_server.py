import pytest
import torch
import torch.nn.functional as F

from mechanisms import Guarantee, Release
from privfed.models import OrchestraNetwork
from privfed.orchestra.model_state import shared_state, state_delta, weighted_mean
from privfed.orchestra.server import OrchestraServer

NONE = Guarantee(kind="none", statement="test")


def release(n: int, dim: int, seed: int) -> Release:
    vectors = F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=1)
    return Release(vectors, torch.full((n,), 4.0), NONE)


def test_round_zero_produces_G_unit_global_centroids():
    server = OrchestraServer(OrchestraNetwork("resnet8", 16), num_global_centroids=8, seed=0)
    before = shared_state(server.network)
    stats = server.apply_round(None, [release(4, 16, s) for s in range(3)])
    assert server.centroids.shape == (8, 16)
    assert torch.allclose(server.centroids.norm(dim=1), torch.ones(8), atol=1e-5)
    assert stats["released_vectors"] == 12
    after = shared_state(server.network)
    assert all(torch.equal(before[k], after[k]) for k in before)  # round 0 does not train


def test_too_few_released_vectors_for_G_centroids_is_an_error():
    server = OrchestraServer(OrchestraNetwork("resnet8", 16), num_global_centroids=8, seed=0)
    with pytest.raises(ValueError, match="fewer than the 8"):
        server.apply_round(None, [release(4, 16, 0)])


def test_the_mean_delta_moves_the_global_model():
    torch.manual_seed(0)
    server = OrchestraServer(OrchestraNetwork("resnet8", 16), num_global_centroids=4, seed=0)
    start = shared_state(server.network)
    ones = {k: torch.ones_like(v) for k, v in start.items()}
    threes = {k: 3 * torch.ones_like(v) for k, v in start.items()}
    server.apply_round(weighted_mean([ones, threes], [30.0, 10.0]), [release(4, 16, 0), release(4, 16, 1)])
    moved = state_delta(shared_state(server.network), start)
    for k, v in moved.items():
        assert torch.allclose(v, torch.full_like(v, 1.5)), k


def test_weighted_mean_rejects_empty_input():
    with pytest.raises(ValueError):
        weighted_mean([], [])

