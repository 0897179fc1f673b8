"""The distributed discrete Gaussian's encoding: rotation, conditional rounding, shares mod m, decoding.

Statistical checks use seeded ``random.Random`` sources, so they are
deterministic; their tolerances are a few standard errors, set before
looking at the draws.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from mechanisms.distributed_noise import (
    MAX_MODULUS,
    centred_residue,
    choose_scale,
    client_share,
    conditional_randomized_round,
    decode_sum,
    padded_dimension,
    randomized_round,
    rotate,
    rotation_signs,
    rounded_norm_bound,
    squared_norm,
    unrotate,
    walsh_hadamard,
)
from mechanisms.noise import discrete_gaussian_variance


def unit_rows(rows: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(rows, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def encode_all(xs, *, source, **kwargs) -> list[np.ndarray]:
    return [client_share(x, source=source, **kwargs) for x in xs]


@pytest.mark.parametrize("dim, padded", [(1, 1), (2, 2), (3, 4), (128, 128), (129, 256), (64 * 129, 16384)])
def test_the_padded_dimension_is_the_next_power_of_two(dim, padded):
    assert padded_dimension(dim) == padded


def test_the_fast_transform_is_the_hadamard_matrix():
    for n in (1, 2, 8, 64):
        assert np.array_equal(walsh_hadamard(np.eye(n)), sylvester(n))


@pytest.mark.parametrize("dim", [1, 5, 64, 100])
def test_rotation_is_orthonormal_and_unrotate_inverts_it(dim):
    x = np.random.default_rng(dim).normal(size=(20, dim))
    y = rotate(x, seed=7)
    assert y.shape == (20, padded_dimension(dim))
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-13)
    back = unrotate(y, seed=7)
    np.testing.assert_allclose(back[:, :dim], x, atol=1e-13)
    np.testing.assert_allclose(back[:, dim:], 0.0, atol=1e-13)
    matrix = rotate(np.eye(padded_dimension(dim)), seed=7)
    np.testing.assert_allclose(matrix @ matrix.T, np.eye(padded_dimension(dim)), atol=1e-13)


def test_rows_are_rotated_alike_and_the_rotation_depends_only_on_the_public_seed():
    x = np.random.default_rng(0).normal(size=(4, 50))
    stacked = rotate(x, seed=3)
    for row, rotated in zip(x, stacked):
        np.testing.assert_allclose(rotate(row, seed=3), rotated, atol=1e-14)
    np.random.seed(1)
    first = rotate(x, seed=3)
    np.random.seed(2)
    assert np.array_equal(first, rotate(x, seed=3))
    assert not np.allclose(rotate(x, seed=4), first)
    assert set(np.unique(rotation_signs(64, seed=3))) == {-1.0, 1.0}


def test_rotation_spreads_a_spike_over_every_coordinate():
    spike = np.zeros(256)
    spike[17] = 1.0
    np.testing.assert_allclose(np.abs(rotate(spike, seed=0)), 1 / 16, atol=1e-15)


def test_the_rounded_norm_bound_is_the_papers_formula():
    c, d, beta = 10.0, 64, 0.01
    likely = c**2 + d / 4 + math.sqrt(2 * math.log(1 / beta)) * (c + math.sqrt(d) / 2)
    assert rounded_norm_bound(c, dim=d, beta=beta) == pytest.approx(math.sqrt(likely))
    # one coordinate and a tiny beta: the deterministic (c + sqrt(d))^2 is the smaller
    assert rounded_norm_bound(0.3, dim=1, beta=1e-12) == pytest.approx(1.3)
    with pytest.raises(ValueError, match="beta"):
        rounded_norm_bound(1.0, dim=4, beta=1.0)


def test_one_rounding_try_exceeds_the_bound_less_often_than_beta():
    # the worst case for variance: every fractional part 1/2, on a vector of norm exactly c
    d, beta = 64, 0.2
    x = np.full(d, 1.5)
    bound = rounded_norm_bound(float(np.linalg.norm(x)), dim=d, beta=beta)
    source = random.Random(0)
    limit = math.floor(bound**2)
    fails = sum(squared_norm(randomized_round(x, source=source)) > limit for _ in range(2000))
    assert fails / 2000 <= beta


def test_randomized_rounding_is_unbiased_per_coordinate():
    x = np.random.default_rng(0).uniform(-5, 5, size=64)
    source = random.Random(1)
    draws = np.array(
        [conditional_randomized_round(x, norm_bound=math.inf, source=source) for _ in range(4000)], dtype=np.float64
    )
    frac = x - np.floor(x)
    standard_error = np.sqrt(frac * (1 - frac) / 4000)
    assert np.all(np.abs(draws.mean(axis=0) - x) <= 4.5 * standard_error + 1e-12)
    assert np.all((draws == np.floor(x)) | (draws == np.ceil(x)))


def test_conditional_rounding_never_exceeds_its_bound():
    x = np.full(32, 0.5) + np.random.default_rng(0).uniform(0, 0.01, size=32)
    bound = math.sqrt(16.5)  # ||z||^2 is Binomial(32, ~1/2): about half the draws must be redone
    source = random.Random(2)
    norms = [squared_norm(conditional_randomized_round(x, norm_bound=bound, source=source)) for _ in range(300)]
    assert max(norms) <= 16


def test_conditional_rounding_raises_after_max_tries_when_the_bound_is_impossible():
    x = np.full(64, 0.5)  # only the zero vector passes a bound of 0: probability 2^-64 per try
    with pytest.raises(RuntimeError, match="5 tries"):
        conditional_randomized_round(x, norm_bound=0.0, source=random.Random(0), max_tries=5)


def test_a_share_is_an_integer_vector_mod_m_of_the_padded_length():
    x = unit_rows(1, 100, 0)[0]
    share = client_share(
        x, scale=1e-3, norm_bound=1.0, sigma_share=5.0, modulus=2**20, rotation_seed=1, source=random.Random(0)
    )
    assert share.dtype == np.int64 and share.shape == (128,)
    assert share.min() >= 0 and share.max() < 2**20


def test_a_share_refuses_a_vector_beyond_its_norm_bound():
    with pytest.raises(ValueError, match="clip it first"):
        client_share(
            np.full(4, 1.0), scale=0.01, norm_bound=1.0, sigma_share=1.0, modulus=2**16, rotation_seed=0
        )
    clipped = np.full(4, 0.5) * (1 + 1e-15)  # a clipped vector's few ulps of overshoot pass
    client_share(clipped, scale=0.01, norm_bound=1.0, sigma_share=1.0, modulus=2**16, rotation_seed=0)


def test_the_decoded_sum_is_the_true_sum_plus_unbiased_noise_of_the_expected_variance():
    # K clients, d = 256 (no padding), 40 rounds: 10,240 error coordinates. The expected error variance per
    # coordinate is gamma^2 (K Var(discrete Gaussian) + mean rounding variance), the latter from the known
    # fractional parts: rotation is orthonormal, so the average variance over coordinates is kept.
    K, d, rounds, gamma, sigma, m, seed = 8, 256, 40, 0.01, 0.7, 2**24, 5
    source = random.Random(3)
    errors, rounding_variance = [], []
    for r in range(rounds):
        xs = unit_rows(K, d, 100 + r)
        scaled = rotate(xs / gamma, seed=seed)
        frac = scaled - np.floor(scaled)
        rounding_variance.append((frac * (1 - frac)).sum(axis=0).mean())
        shares = encode_all(
            xs, source=source, scale=gamma, norm_bound=1.0, sigma_share=sigma, modulus=m, rotation_seed=seed
        )
        total = np.mod(np.sum(shares, axis=0), m)
        errors.append(decode_sum(total, modulus=m, scale=gamma, rotation_seed=seed, dim=d) - xs.sum(axis=0))
    errors = np.concatenate(errors)
    expected = gamma**2 * (K * discrete_gaussian_variance(sigma) + np.mean(rounding_variance))
    assert K * discrete_gaussian_variance(sigma) * gamma**2 < expected <= K * (sigma**2 + 0.25) * gamma**2
    n = errors.size
    assert abs(errors.mean()) <= 4 * math.sqrt(expected / n)
    assert errors.var() == pytest.approx(expected, rel=4 * math.sqrt(2 / n))


def test_partial_sums_that_wrap_around_m_still_decode_when_the_total_fits():
    # Inputs built so that their scaled rotations are chosen integer vectors: 0.4m + 0.4m wraps past m/2,
    # then -0.5m brings the total back to 0.3m. SecAgg+-style masks that cancel mod m are added too.
    m, d, gamma, seed = 2**32, 16, 1e-6, 9
    targets = np.array([[0.4, -0.45], [0.4, -0.45], [-0.5, 0.6]]) * m
    targets = np.hstack([np.round(targets), np.zeros((3, d - 2))])
    xs = unrotate(targets, seed=seed) * gamma
    norm_bound = float(np.linalg.norm(xs, axis=1).max())
    source = random.Random(4)
    shares = encode_all(
        xs, source=source, scale=gamma, norm_bound=norm_bound, sigma_share=2**-20, modulus=m, rotation_seed=seed
    )
    masks = np.random.default_rng(0).integers(0, m, size=(2, d))
    masks = np.vstack([masks, np.mod(-masks.sum(axis=0), m)])
    masked = [np.mod(s + k, m) for s, k in zip(shares, masks)]
    assert centred_residue(shares[0] + shares[1], m)[0] < 0  # the first two shares' sum wrapped past m/2
    total = np.mod(np.sum(masked, axis=0), m)
    decoded = decode_sum(total, modulus=m, scale=gamma, rotation_seed=seed, dim=d)
    assert np.linalg.norm(decoded - xs.sum(axis=0)) <= gamma * 3 * math.sqrt(d)  # one step per client and coordinate
    assert np.linalg.norm(decoded) > 0.25 * m * gamma


def test_a_total_outside_the_centred_range_decodes_wrongly():
    m, seed = 2**16, 0
    target = np.zeros(4)
    target[0] = 0.3 * m
    x = unrotate(target, seed=seed)
    kwargs = {"scale": 1.0, "norm_bound": 0.3 * m, "sigma_share": 2**-20, "modulus": m, "rotation_seed": seed}
    shares = [client_share(x, **kwargs) for _ in range(2)]
    decoded = decode_sum(np.mod(sum(shares), m), modulus=m, scale=1.0, rotation_seed=seed, dim=4)
    assert np.linalg.norm(decoded - 2 * x) == pytest.approx(m, rel=1e-3)  # 0.6m came back as -0.4m


def test_choose_scale_keeps_the_sum_in_range_and_a_finer_scale_wraps():
    m, d, K, share_std, seed = 2**16, 64, 30, 0.05, 2
    gamma = choose_scale(norm_bound=1.0, dim=d, modulus=m, max_clients=K, share_std=share_std)
    x = np.zeros(d)
    x[0] = 1.0  # all clients aligned: the largest signal the bound allows
    source = random.Random(5)
    for scale, wraps in ((gamma, False), (gamma / 30, True)):
        kwargs = {"scale": scale, "norm_bound": 1.0, "sigma_share": share_std / scale, "modulus": m, "rotation_seed": seed}
        total = np.mod(np.sum(encode_all([x] * K, source=source, **kwargs), axis=0), m)
        error = decode_sum(total, modulus=m, scale=scale, rotation_seed=seed, dim=d) - K * x
        # the noise's norm is about share_std sqrt(K d) = 2.2; a wrap moves a rotated coordinate by m steps
        assert (np.linalg.norm(error) > 10.0) == wraps


def test_choose_scale_raises_when_no_scale_fits():
    with pytest.raises(ValueError, match="rounding errors"):
        choose_scale(norm_bound=1.0, dim=64, modulus=2**8, max_clients=2000, share_std=0.1)
    with pytest.raises(ValueError, match="coarser than the norm bound"):
        choose_scale(norm_bound=1.0, dim=64, modulus=2**8, max_clients=10, share_std=10.0)
    with pytest.raises(ValueError, match="modulus"):
        choose_scale(norm_bound=1.0, dim=64, modulus=MAX_MODULUS + 1, max_clients=10, share_std=1.0)


def test_coins_and_noise_come_from_the_source_alone():
    x = unit_rows(1, 40, 0)[0]
    kwargs = {"scale": 0.01, "norm_bound": 1.0, "sigma_share": 3.0, "modulus": 2**20, "rotation_seed": 1}
    np.random.seed(0)
    state = np.random.get_state()
    first = client_share(x, source=random.Random(11), **kwargs)
    after = np.random.get_state()
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b for a, b in zip(state, after))
    np.random.seed(123)
    assert np.array_equal(client_share(x, source=random.Random(11), **kwargs), first)
    assert not np.array_equal(client_share(x, source=random.Random(12), **kwargs), first)


def test_centred_residues_cover_minus_half_to_half():
    m = 10
    values = np.arange(-25, 25)
    centred = centred_residue(values, m)
    assert centred.min() == -5 and centred.max() == 4
    assert np.array_equal(np.mod(centred, m), np.mod(values, m))
    assert set(centred_residue(np.arange(7), 7)) == {-3, -2, -1, 0, 1, 2, 3}
