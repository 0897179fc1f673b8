import pytest
import torch
import torch.nn.functional as F

from mechanisms import Guarantee, Release
from privfed.methods import get_method
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


def test_too_few_released_vectors_move_only_their_nearest_centroids_or_fill_round_zero_at_random():
    """Small clients release fewer centroids than L under --kanon-min-k; the round must not fail for it."""
    server = OrchestraServer(OrchestraNetwork("resnet8", 16), num_global_centroids=8, seed=0)
    few = release(4, 16, 0)
    server.apply_round(None, [few])
    assert server.centroids.shape == (8, 16)
    assert torch.allclose(server.centroids[:4], few.vectors, atol=1e-6)  # the released ones, as they are
    assert torch.allclose(server.centroids.norm(dim=1), torch.ones(8), atol=1e-5)
    first = server.centroids.clone()
    server.apply_round(None, [release(3, 16, 1)])
    assert int((server.centroids == first).all(dim=1).sum()) >= 5  # only the 3 vectors' nearest centroids move


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



def test_the_fixed_centroid_control_draws_its_centroids_once_and_keeps_them():
    server = OrchestraServer(
        OrchestraNetwork("resnet8", 16), num_global_centroids=8, seed=0, method=get_method("orchestra-fixed-centroids")
    )
    assert not server.initialised
    assert server.apply_round(None, []) == {}  # round 0: nothing released, nothing clustered
    assert server.initialised and server.centroids.shape == (8, 16)
    assert torch.allclose(server.centroids.norm(dim=1), torch.ones(8), atol=1e-5)
    first = server.centroids.clone()
    start = shared_state(server.network)
    server.apply_round({k: torch.ones_like(v) for k, v in start.items()}, [])
    assert torch.equal(server.centroids, first)  # the model moved, the centroids did not
    assert any(not torch.equal(start[k], v) for k, v in shared_state(server.network).items())


def test_rotpred_has_no_centroids_and_a_method_gets_only_the_releases_it_makes():
    rotpred = OrchestraServer(OrchestraNetwork("resnet8", 16), num_global_centroids=8, seed=0, method=get_method("rotpred"))
    rotpred.apply_round(None, [])
    assert rotpred.initialised and rotpred.centroids is None
    with pytest.raises(ValueError, match="releases nothing"):
        rotpred.apply_round(None, [release(4, 16, 0)])
    orchestra = OrchestraServer(OrchestraNetwork("resnet8", 16), num_global_centroids=8, seed=0)
    with pytest.raises(ValueError, match="at least one client release"):
        orchestra.apply_round(None, [])


def test_the_round_reports_the_fraction_of_released_vectors_that_carry_weight():
    server = OrchestraServer(OrchestraNetwork("resnet8", 16), num_global_centroids=8, seed=0)
    padded = release(4, 16, 2)
    padded = Release(padded.vectors, torch.tensor([4.0, 0.0, 0.0, 0.0]), NONE)
    stats = server.apply_round(None, [release(4, 16, 1), padded])
    assert stats["weighted_vector_fraction"] == 5 / 8

def test_weighted_mean_is_bit_for_bit_the_float64_sum_of_the_scaled_deltas_in_client_order():
    """Accumulated in place, the mean is exactly the plain left-to-right float64 sum (same metrics for the same seed)."""
    gen = torch.Generator().manual_seed(3)
    deltas = [{"w": torch.randn(257, 3, generator=gen) * 1e-3, "b": torch.randn(5, generator=gen)} for _ in range(7)]
    weights = [float(w) for w in (13, 1, 250, 7, 7, 99, 2)]
    for count in (1, 2, 7):
        mean = weighted_mean(deltas[:count], weights[:count])
        part = sum(weights[:count])
        for key in ("w", "b"):
            expected = deltas[0][key].double() * (weights[0] / part)
            for d, w in zip(deltas[1:count], weights[1:count]):
                expected = expected + d[key].double() * (w / part)
            assert mean[key].dtype == torch.float32
            assert torch.equal(mean[key], expected.float()), (count, key)
