"""``ldp-sums`` on a secret Poisson sample of its input: the draw, the sensitivity and the amplified charge.

The audit follows ``tests/mechanisms/test_ldp_sums.py``: canaries, each in its
own cell and each kept by the mechanism's own coin, released at once by its
own :func:`~mechanisms.ldp_sums.noisy_cell_statistics`; a threshold fixed in
advance from the claimed noise gives a Clopper-Pearson lower bound on
epsilon, below the ledger's at the calibrated noise and above it at half.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mechanisms import accounting, create_mechanism
from mechanisms.dp_pieces import clip_to_radius
from mechanisms.ldp_sums import (
    LdpSumsMechanism,
    cell_table,
    count_scale,
    nearest_cells,
    noisy_cell_statistics,
    row_bound,
    sums_grid,
    sums_noise_multiplier,
)
from mechanisms.noise import poisson_sample_mask
from tests.mechanisms.test_ldp_audit import epsilon_lower_bound
from tests.mechanisms.test_ldp_sums import NO_NOISE, clustered, gen, unit


def sampled_members(rate: float, rows: torch.Tensor, *, source_seed: int, generator_seed: int = 0) -> torch.Tensor:
    """Which rows entered a nearly noiseless sampled release whose every cell is released."""
    centres = unit(4, rows.shape[1], seed=1)
    mechanism = create_mechanism(
        "ldp-sums", **NO_NOISE, count_threshold=-1e9, sampling_rate=rate, noise_source=random.Random(source_seed)
    )
    mechanism.observe_global_centroids(centres)
    _, members = mechanism.release_with_members(rows, num_centroids=4, generator=gen(generator_seed))
    return members >= 0


def test_the_sample_comes_from_the_noise_source_and_never_from_the_rounds_generator():
    rows = clustered(400, 8, unit(4, 8, seed=1))
    first = sampled_members(0.5, rows, source_seed=1, generator_seed=0)
    assert torch.equal(first, sampled_members(0.5, rows, source_seed=1, generator_seed=7))
    assert not torch.equal(first, sampled_members(0.5, rows, source_seed=2, generator_seed=0))


def test_each_row_joins_the_release_with_the_declared_rate():
    rows = clustered(8_000, 4, unit(4, 4, seed=1))
    kept = int(sampled_members(0.25, rows, source_seed=3).sum())
    assert abs(kept - 2_000) < 4 * math.sqrt(8_000 * 0.25 * 0.75)


def test_rate_one_keeps_every_row_and_charges_the_unsampled_gaussian():
    rows = clustered(300, 8, unit(4, 8, seed=1))
    assert bool(sampled_members(1.0, rows, source_seed=3).all())
    assert create_mechanism("ldp-sums", epsilon=1.0).privacy_events()[0].name == "gaussian"


@pytest.mark.parametrize("rate", [1e-9, 0.3, 1.0])
def test_no_coin_is_likelier_than_the_rate(rate):
    coins = poisson_sample_mask(200_000, rate, source=random.Random(0))
    assert coins.mean() <= rate + 4 * math.sqrt(rate * (1 - rate) / 200_000)
    assert coins.mean() >= rate - 4 * math.sqrt(rate * (1 - rate) / 200_000) - 1e-12


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, float("nan")])
def test_a_rate_outside_zero_one_is_refused(rate):
    with pytest.raises(ValueError, match="sampling_rate"):
        create_mechanism("ldp-sums", epsilon=1.0, sampling_rate=rate)


@pytest.mark.parametrize("dim", [2, 16])
def test_a_sampled_rows_presence_moves_the_table_by_at_most_the_sampled_row_bound(dim):
    """dp_accounting's subsampled Gaussian assumes each kept row moves the table by at most the unit."""
    grid = sums_grid(dim)
    centres = unit(5, dim, seed=8).double()
    data = unit(30, dim, seed=9).double()
    largest = 0.0
    for trial in range(30):
        rows = 1e6 * data if trial % 2 else data  # far outside the unit ball: clipping must hold the bound
        clipped = clip_to_radius(rows, 1.0)

        def table(x: torch.Tensor) -> np.ndarray:
            rounded = np.rint(x.numpy() / grid.step).astype(np.int64)
            return cell_table(rounded, nearest_cells(x, centres).numpy(), 5, count_scale(grid))

        without = torch.cat([clipped[:trial], clipped[trial + 1 :]])
        shift = float(np.linalg.norm(table(clipped) - table(without)))
        assert shift <= row_bound(grid, sampled=True)
        largest = max(largest, shift)
    assert largest >= 0.98 * math.sqrt(2) * count_scale(grid)  # a unit row and its count reach it: not vacuous


@pytest.mark.parametrize("epsilon,delta,releases,rate", [(10.0, 1e-6, 21, 0.5), (1.0, 1e-3, 11, 0.25)])
def test_sampled_calibration_fits_the_ledger_and_not_with_less_noise(epsilon, delta, releases, rate):
    params = LdpSumsMechanism.calibrate(epsilon=epsilon, delta=delta, num_releases=releases, sampling_rate=rate)
    assert params["sampling_rate"] == rate
    mechanism = create_mechanism("ldp-sums", **params)
    (event,) = mechanism.privacy_events()
    assert event.name == "poisson_gaussian" and event.params["sampling_rate"] == rate
    grid = accounting.calibration_discretisation(epsilon, 0)
    assert accounting.epsilon_of([event] * releases, delta, discretisation=grid) <= epsilon
    less = accounting.poisson_gaussian_privacy_event(rate, 0.99 * mechanism.noise_multiplier, count=releases)
    assert accounting.epsilon_of([less], delta, discretisation=grid) > epsilon


@pytest.mark.parametrize("rate,least,most", [(0.7, 0.9, 1.0), (0.5, 0.6, 0.75), (0.25, 0.3, 0.45)])
def test_the_sample_cuts_the_noise_per_row_at_the_same_epsilon(rate, least, most):
    """The noise std in data units, against the unsampled release's: what the amplification buys (with its sqrt 2 unit)."""
    grid = sums_grid(32)
    unsampled = sums_noise_multiplier(10.0, 1e-6, num_releases=21) * row_bound(grid, sampled=False)
    sampled = sums_noise_multiplier(10.0, 1e-6, num_releases=21, sampling_rate=rate) * row_bound(grid, sampled=True)
    assert least < sampled / unsampled < most


def test_the_guarantee_names_the_sample():
    mechanism = create_mechanism("ldp-sums", epsilon=2.0, sampling_rate=0.5)
    release = mechanism.release(unit(50, 8, seed=3), num_centroids=4, generator=gen())
    assert "secret Poisson sample of rate 0.5" in release.guarantee.statement
    assert release.guarantee.epsilon == pytest.approx(accounting.epsilon_of(mechanism.privacy_events(), mechanism.delta))
    assert "sampled" not in " ".join(release.metrics)  # the sample's size is not released


# --------------------------------------------------------------------------- audit

TRIALS = 200_000
AUDIT_DELTA = 1e-3


@pytest.mark.parametrize("rate", [0.5, 0.25])
@pytest.mark.parametrize("noise_scale,caught", [(1.0, False), (0.5, True)])
def test_an_antipodal_canary_kept_by_the_mechanisms_coin_catches_half_the_calibrated_noise(rate, noise_scale, caught):
    """Neighbours: the canary is +e1 or, replaced, -e1 in its cell, kept with probability q; the test: sum above a threshold."""
    mechanism = create_mechanism("ldp-sums", epsilon=2.0, delta=AUDIT_DELTA, sampling_rate=rate)
    claimed = accounting.epsilon_of(mechanism.privacy_events(), AUDIT_DELTA)
    z = mechanism.noise_multiplier
    statistics = []
    for sign, seed in ((1.0, 1), (-1.0, 2)):
        source = random.Random(seed)
        kept = poisson_sample_mask(TRIALS, rate, source=source)
        rows = torch.full((TRIALS, 1), sign, dtype=torch.float64)
        _, sums = noisy_cell_statistics(
            rows, torch.arange(TRIALS), TRIALS, noise_multiplier=z * noise_scale, source=source, kept=kept
        )
        statistics.append(sums[:, 0].numpy())
    threshold = 1.5 * math.sqrt(2) * z  # fixed in advance: 1.5 claimed stds of a sum entry (about sqrt(2) z)
    bound = epsilon_lower_bound(int((statistics[0] > threshold).sum()), int((statistics[1] > threshold).sum()),
                                TRIALS, AUDIT_DELTA)
    assert (bound > claimed) == caught, (bound, claimed)


def test_release_draws_its_coins_before_the_noise_from_one_source():
    """The audit above reads the mechanism's own order: coins for every row, then the table's noise."""
    rows = F.normalize(torch.randn(64, 3, generator=gen(4), dtype=torch.float64), dim=1)
    mechanism = create_mechanism(
        "ldp-sums", noise_multiplier=1.0, count_threshold=-1e9, sampling_rate=0.5, noise_source=random.Random(9)
    )
    mechanism.observe_global_centroids(torch.ones(1, 3))
    _, members = mechanism.release_with_members(rows, num_centroids=1, generator=gen(5))
    coins = poisson_sample_mask(64, 0.5, source=random.Random(9))
    assert torch.equal(members >= 0, torch.from_numpy(coins))


@pytest.mark.parametrize("rate", [1.0, 0.5])
def test_the_default_threshold_is_three_stds_of_the_count_noise_actually_drawn(rate):
    """A sampled release scales its noise to the larger sampled unit; the threshold must follow it."""
    mechanism = create_mechanism("ldp-sums", noise_multiplier=2.0, sampling_rate=rate)
    counts, _ = noisy_cell_statistics(
        torch.zeros(0, 16, dtype=torch.float64), torch.zeros(0, dtype=torch.long), 40_000, noise_multiplier=2.0,
        source=random.Random(3), kept=np.zeros(0, dtype=bool) if rate < 1 else None,
    )
    measured = float(np.std(counts))
    assert 0.97 * mechanism.count_noise_std <= measured <= 1.02 * mechanism.count_noise_std
    assert mechanism.threshold == pytest.approx(3 * mechanism.count_noise_std)


def test_a_dropped_row_is_added_as_zeros_so_the_table_is_the_kept_rows_alone():
    """The release adds every row (timing does not tell the sample's size); dropped ones must add nothing."""
    grid = sums_grid(4)
    rows = clip_to_radius(unit(50, 4, seed=6).double(), 1.0)
    rounded = np.rint(rows.numpy() / grid.step).astype(np.int64)
    cells = nearest_cells(rows, unit(3, 4, seed=7).double()).numpy()
    kept = poisson_sample_mask(50, 0.5, source=random.Random(1))
    masked = cell_table(rounded, cells, 3, count_scale(grid), kept=kept)
    assert np.array_equal(masked, cell_table(rounded[kept], cells[kept], 3, count_scale(grid)))
