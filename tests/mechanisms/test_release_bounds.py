"""The bounds the server holds releases to (count, total weight) admit every honest release."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mechanisms import create_mechanism, get_mechanism_class
from mechanisms.base import DP_WEIGHT_ROOM, ReleaseMechanism


def clustered_reps(n: int, seed: int, dim: int = 16) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(4, dim, generator=generator), dim=1)
    rows = centres[torch.randint(0, 4, (n,), generator=generator)] + 0.1 * torch.randn(n, dim, generator=generator)
    return F.normalize(rows, dim=1)


def params_of(name: str, epsilon: float) -> dict:
    cls = get_mechanism_class(name)
    if cls.is_differentially_private():
        return cls.calibrate(epsilon=epsilon, delta=1e-5, num_releases=41)
    return {"min_k": 2} if name == "kanon" else {}


@pytest.mark.parametrize("name", ["reps", "kanon", "ldp", "ldp-sums"])
@pytest.mark.parametrize("epsilon", [0.5, 10.0])
@pytest.mark.parametrize("n", [12, 128, 400])
def test_honest_releases_stay_within_the_bounds(name, epsilon, n):
    cls = get_mechanism_class(name)
    params = params_of(name, epsilon)
    mechanism = create_mechanism(name, **params)
    most, heaviest = cls.max_vectors(num_reps=n, num_centroids=4), cls.max_total_weight(num_reps=n, params=params)
    for seed in range(20):
        release = mechanism.release(clustered_reps(n, seed), num_centroids=4, generator=torch.Generator().manual_seed(seed))
        assert release.num_vectors <= most
        assert float(release.weights.sum()) <= heaviest


def test_only_ldp_leaves_room_for_noise_and_only_reps_sends_a_vector_per_representation():
    assert get_mechanism_class("kanon").max_total_weight(num_reps=100, params={"min_k": 2}) == 100
    ldp = get_mechanism_class("ldp")
    loose, tight = (ldp.max_total_weight(num_reps=100, params=params_of("ldp", eps)) for eps in (0.5, 10.0))
    assert loose > tight > 100  # more noise, more room; still far below a hostile 1e9
    assert loose < 1e7
    assert get_mechanism_class("reps").max_vectors(num_reps=100, num_centroids=4) == 100
    assert get_mechanism_class("kanon").max_vectors(num_reps=100, num_centroids=4) == 4


def test_a_dp_mechanism_that_does_not_bound_its_noise_still_has_a_finite_weight_bound():
    class Unbounded(get_mechanism_class("ldp")):  # a plugin that leaves max_total_weight to the base class
        max_total_weight = classmethod(ReleaseMechanism.max_total_weight.__func__)

    assert Unbounded.max_total_weight(num_reps=10, params={}) == 10 * DP_WEIGHT_ROOM
    assert Unbounded.max_total_weight(num_reps=0, params={}) == DP_WEIGHT_ROOM
