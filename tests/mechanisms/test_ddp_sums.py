"""The distributed half of ``ddp-sums``: shares that sum, under a modulus, to the table plus the release's noise.

The audit follows ``tests/mechanisms/test_ldp_sums.py``: one client holds a
canary per cell, ``K_min - 1`` others hold nothing; their shares are summed
mod ``m`` and decoded, and a threshold fixed in advance gives a
Clopper-Pearson lower bound on epsilon, below ``ldp-sums``'s ledger epsilon
(the charge ``ddp-sums`` shares) at the calibrated noise and above it at half.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mechanisms import SecureSumMechanism, accounting, create_mechanism
from mechanisms.ddp_sums import (
    MIN_SHARE_SIGMA,
    centred_residue,
    check_fits_modulus,
    decode_table,
    noisy_share,
    share_sigma,
    table_share,
)
from mechanisms.dp_pieces import clip_to_radius
from mechanisms.ldp_sums import cell_table, count_scale, lloyd_step, nearest_cells, sums_grid
from tests.mechanisms.test_ldp_audit import epsilon_lower_bound

MODULUS = 2**32


def unit(rows: int, dim: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64), dim=1)


def exact_table(reps: torch.Tensor, centres: torch.Tensor) -> np.ndarray:
    grid = sums_grid(reps.shape[1])
    x = clip_to_radius(reps.double(), 1.0)
    rounded = np.rint(x.numpy() / grid.step).astype(np.int64)
    return cell_table(rounded, nearest_cells(x, centres).numpy(), centres.shape[0], count_scale(grid)).ravel()


def summed(shares: list[np.ndarray], modulus: int = MODULUS) -> np.ndarray:
    total = np.zeros_like(shares[0])
    for share in shares:
        total = np.mod(total + share, modulus)
    return total


@pytest.mark.parametrize("clients,min_shares", [(5, 5), (8, 4)])
def test_the_decoded_sum_is_the_summed_table_plus_noise_of_the_stated_variance(clients, min_shares):
    dim, cells, z = 4, 512, 2.0
    centres = unit(cells, dim, seed=1)
    data = [unit(60, dim, seed=10 + k) for k in range(clients)]
    shares = [
        table_share(x, centres, noise_multiplier=z, min_shares=min_shares, modulus=MODULUS, source=random.Random(k))
        for k, x in enumerate(data)
    ]
    noise = decode_table(summed(shares), num_cells=cells, dim=dim, modulus=MODULUS)
    exact = decode_table(np.mod(sum(exact_table(x, centres) for x in data), MODULUS), num_cells=cells, dim=dim,
                         modulus=MODULUS)
    grid = sums_grid(dim)
    errors = np.concatenate([(noise[1] - exact[1]).numpy().ravel() / grid.step, (noise[0] - exact[0]) * count_scale(grid)])
    expected = clients * share_sigma(z, min_shares=min_shares, dim=dim, sampled=False) ** 2
    assert abs(errors.mean()) < 4 * math.sqrt(expected / errors.size)
    assert abs(errors.var() / expected - 1) < 4 * math.sqrt(2 / errors.size)


def test_partial_sums_that_wrap_the_modulus_still_decode_to_the_true_sum():
    dim, cells, modulus = 2, 3, 2**20
    centres = unit(cells, dim, seed=2)
    data = [unit(200, dim, seed=20 + k) for k in range(6)]
    shares = [
        table_share(x, centres, noise_multiplier=0.05, min_shares=1, modulus=modulus, source=random.Random(k))
        for k, x in enumerate(data)
    ]
    assert any(s.max() > modulus // 2 for s in shares)  # negative noise on small entries wraps to the top
    counts, sums = decode_table(summed(shares, modulus), num_cells=cells, dim=dim, modulus=modulus)
    exact_counts, exact_sums = decode_table(
        np.mod(sum(exact_table(x, centres) for x in data), modulus), num_cells=cells, dim=dim, modulus=modulus
    )
    noise_std = math.sqrt(6) * share_sigma(0.05, min_shares=1, dim=dim, sampled=False) / count_scale(sums_grid(dim))
    assert np.abs(counts - exact_counts).max() < 5 * noise_std and float((sums - exact_sums).abs().max()) < 5 * noise_std


def test_a_modulus_the_sum_could_wrap_is_refused_and_a_roomy_one_accepted():
    common = dict(num_cells=64, dim=32, max_clients=100, max_rows=2000, noise_multiplier=10.0, sampled=False)
    with pytest.raises(ValueError, match="beyond the modulus"):
        check_fits_modulus(modulus=2**24, **common)
    check_fits_modulus(modulus=2**32, **common)


def test_a_share_too_small_for_the_sum_to_stay_discrete_gaussian_is_refused():
    tiny = MIN_SHARE_SIGMA / 2 / sums_grid(8).sensitivity
    with pytest.raises(ValueError, match="below"):
        share_sigma(tiny, min_shares=1, dim=8, sampled=False)
    assert share_sigma(tiny * 4, min_shares=4, dim=8, sampled=False) == pytest.approx(MIN_SHARE_SIGMA)


def test_the_sample_draws_its_coins_from_the_source():
    centres = unit(2, 3, seed=3)
    x = unit(400, 3, seed=4)
    common = dict(noise_multiplier=1.0, min_shares=1, modulus=MODULUS, sampling_rate=0.5)
    a = table_share(x, centres, source=random.Random(1), **common)
    assert np.array_equal(a, table_share(x, centres, source=random.Random(1), **common))
    counts, _ = decode_table(a, num_cells=2, dim=3, modulus=MODULUS)
    assert abs(counts.sum() - 200) < 4 * 10 + 8 * 1.5  # about half the rows, give or take the sample and the noise


def test_the_lloyd_step_moves_only_cells_whose_noisy_count_passes():
    previous = unit(3, 4, seed=5)
    sums = torch.tensor([[2.0, 0, 0, 0], [0, 3.0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    moved = lloyd_step(previous, np.array([10.0, 2.0, 50.0]), sums, threshold=5.0)
    assert torch.allclose(moved[0], torch.tensor([1.0, 0, 0, 0], dtype=torch.float64))
    assert torch.equal(moved[1], previous[1]) and torch.equal(moved[2], previous[2])  # below, and an empty sum


# --------------------------------------------------------------------------- audit

TRIALS = 100_000
AUDIT_DELTA = 1e-3


@pytest.mark.parametrize("noise_scale,caught", [(1.0, False), (0.5, True)])
def test_a_canary_among_k_min_clients_catches_half_the_calibrated_noise(noise_scale, caught):
    """Neighbours: client 0's canary is +e1 or, replaced, -e1 in its cell; K_min - 1 clients add only their shares.

    Each trial is its own cell (row i in cell i), so one sum releases them all.
    """
    mechanism = create_mechanism("ldp-sums", epsilon=2.0, delta=AUDIT_DELTA)
    claimed = accounting.epsilon_of(mechanism.privacy_events(), AUDIT_DELTA)
    z, k_min, grid = mechanism.noise_multiplier, 4, sums_grid(1)
    sigma = share_sigma(z * noise_scale, min_shares=k_min, dim=1, sampled=False)
    statistics = []
    for sign, seed in ((1.0, 1), (-1.0, 2)):
        canary = np.rint(np.full((TRIALS, 1), sign) / grid.step).astype(np.int64)
        tables = [cell_table(canary, np.arange(TRIALS), TRIALS, count_scale(grid)).ravel()]
        tables += [np.zeros_like(tables[0]) for _ in range(k_min - 1)]
        shares = [noisy_share(t, sigma=sigma, modulus=MODULUS, source=random.Random(10 * seed + k)) for k, t in enumerate(tables)]
        _, sums = decode_table(summed(shares), num_cells=TRIALS, dim=1, modulus=MODULUS)
        statistics.append(sums[:, 0].numpy())
    threshold = 1.5 * z  # fixed in advance: 1.5 claimed stds of a summed sum entry (about z)
    bound = epsilon_lower_bound(int((statistics[0] > threshold).sum()), int((statistics[1] > threshold).sum()),
                                TRIALS, AUDIT_DELTA)
    assert (bound > claimed) == caught, (bound, claimed)


# --------------------------------------------------------------------------- the mechanism


def test_the_mechanism_charges_ldp_sums_event_and_shares_instead_of_releasing():
    from mechanisms import available_mechanisms
    from mechanisms.ddp_sums import DdpSumsMechanism

    params = DdpSumsMechanism.calibrate(epsilon=10.0, delta=1e-6, num_releases=21, sampling_rate=0.5)
    mechanism = DdpSumsMechanism(**params, min_shares=4)
    assert isinstance(mechanism, SecureSumMechanism)
    assert mechanism.privacy_events() == create_mechanism("ldp-sums", **params).privacy_events()
    assert "ddp-sums" in available_mechanisms()
    assert mechanism.share_length(num_cells=16, dim=32) == 16 * 33
    assert not hasattr(mechanism, "release")  # the secure-sum kind has no per-client release
    assert not DdpSumsMechanism.releases_in(train=False) and DdpSumsMechanism.max_releases(20) == 20


def test_shares_of_k_clients_combine_into_the_exact_lloyd_step_at_little_noise():
    from mechanisms.ddp_sums import DdpSumsMechanism

    centres = unit(4, 8, seed=6)
    data = [F.normalize(centres[k % 4] + 0.1 * unit(40, 8, seed=30 + k), dim=1) for k in range(5)]
    mechanism = DdpSumsMechanism(
        noise_multiplier=0.2, delta=1e-6, min_shares=5, momentum=0.0, noise_source=random.Random(2)
    )
    mechanism.observe_global_centroids(centres)
    total = summed([mechanism.share(x, num_centroids=4, generator=torch.Generator()) for x in data])
    combined = mechanism.combine(total, centroids=centres, num_summed=5)
    exact_counts, exact_sums = decode_table(
        np.mod(sum(exact_table(x, centres) for x in data), MODULUS), num_cells=4, dim=8, modulus=MODULUS
    )
    exact = lloyd_step(centres, exact_counts, exact_sums, threshold=0.5)
    assert float(F.cosine_similarity(combined, exact, dim=1).min()) > 0.999
    with pytest.raises(ValueError, match="less noise"):
        mechanism.combine(total, centroids=centres, num_summed=4)


def test_decode_gives_the_unit_sums_and_counts_combine_steps_from() -> None:
    from mechanisms.ddp_sums import DdpSumsMechanism

    centres = unit(4, 8, seed=6)
    data = [F.normalize(centres[k % 4] + 0.1 * unit(40, 8, seed=30 + k), dim=1) for k in range(5)]
    mechanism = DdpSumsMechanism(noise_multiplier=0.2, delta=1e-6, min_shares=5, noise_source=random.Random(3))
    mechanism.observe_global_centroids(centres)
    total = summed([mechanism.share(x, num_centroids=4, generator=torch.Generator()) for x in data])
    vectors, weights = mechanism.decode(total, num_cells=4, dim=8)
    counts, sums = decode_table(total, num_cells=4, dim=8, modulus=MODULUS)
    assert torch.equal(weights, torch.from_numpy(counts)) and torch.equal(vectors, F.normalize(sums, dim=1))
    threshold = mechanism.move_threshold(dim=8, num_summed=5)
    step = lloyd_step(centres, weights.numpy(), vectors, threshold=threshold, momentum=mechanism.momentum)
    assert torch.allclose(mechanism.combine(total, centroids=centres, num_summed=5), step, rtol=0, atol=1e-12)


def test_a_share_needs_the_centroids_every_client_partitions_by():
    from mechanisms.ddp_sums import DdpSumsMechanism

    with pytest.raises(ValueError, match="global centroids"):
        DdpSumsMechanism(noise_multiplier=1.0, delta=1e-6).share(unit(5, 4, seed=1), num_centroids=2,
                                                                  generator=torch.Generator())


def test_a_share_of_non_finite_representations_is_refused_before_any_noise():
    from mechanisms.ddp_sums import DdpSumsMechanism

    mechanism = DdpSumsMechanism(noise_multiplier=1.0, delta=1e-6)
    mechanism.observe_global_centroids(unit(2, 4, seed=1))
    reps = unit(5, 4, seed=2)
    reps[1, 0] = float("nan")
    with pytest.raises(ValueError):
        mechanism.share(reps, num_centroids=2, generator=torch.Generator())


def test_centred_residues_cover_minus_half_to_half():
    m = 10
    values = np.arange(-25, 25)
    centred = centred_residue(values, m)
    assert centred.min() == -5 and centred.max() == 4
    assert np.array_equal(np.mod(centred, m), np.mod(values, m))
    assert set(centred_residue(np.arange(7), 7)) == {-3, -2, -1, 0, 1, 2, 3}


def test_the_server_ema_moves_a_cell_part_of_the_way_and_leaves_quiet_cells_alone():
    previous = unit(3, 4, seed=11)
    sums = unit(3, 4, seed=12) * 50
    counts = np.array([50.0, 50.0, 0.0])
    half = lloyd_step(previous, counts, sums, threshold=10.0, momentum=0.5)
    expected = F.normalize(0.5 * previous[:2] + 0.5 * F.normalize(sums[:2], dim=1), dim=1)
    assert torch.allclose(half[:2], expected) and torch.equal(half[2], previous[2])
    with pytest.raises(ValueError, match="momentum"):
        lloyd_step(previous, counts, sums, threshold=10.0, momentum=1.0)


@pytest.mark.parametrize("threshold,modulus,refused", [(4, MODULUS, False), (6, MODULUS, False), (3, MODULUS, True),
                                                       (4, 2**31, True)])
def test_a_secure_sum_below_k_min_or_under_another_modulus_is_refused(threshold, modulus, refused):
    from mechanisms.ddp_sums import DdpSumsMechanism

    mechanism = DdpSumsMechanism(noise_multiplier=1.0, delta=1e-6, min_shares=4, modulus=MODULUS)
    if refused:
        with pytest.raises(ValueError):
            mechanism.check_secure_sum(threshold=threshold, modulus=modulus)
    else:
        mechanism.check_secure_sum(threshold=threshold, modulus=modulus)


def test_the_plan_refuses_a_sum_that_could_wrap_the_modulus():
    from mechanisms.ddp_sums import DdpSumsMechanism

    mechanism = DdpSumsMechanism(noise_multiplier=1.0, delta=1e-6, min_shares=4, modulus=2**20)
    mechanism.check_sum_capacity(max_summed=2, max_rows=2, num_cells=4, dim=4)
    with pytest.raises(ValueError, match="modulus"):
        mechanism.check_sum_capacity(max_summed=100, max_rows=5000, num_cells=4, dim=4)
