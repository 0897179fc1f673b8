"""The ``ldp`` mechanism against its accountant: sensitivities read off the mechanism, and an audit with power.

Two questions a reader of the ledger should be able to ask of the code:

* Are the sensitivities the accountant charges the ones the mechanism has?
  :func:`mechanisms.accounting.replace_one_pld` assumes a replaced
  representation moves at most two counts per count query, by one each, and
  a leaf sum by at most twice one representation's contribution. The first
  tests replace representations, including the worst cases, and measure
  what changes in the mechanism's own pre-noise statistics.
* Would the audit notice if the noise were too small? Worst-case canaries
  (a one-hot sum coordinate flipped within its leaf; a count moved between
  two leaves) are released many times at once, each in its own leaf, by the
  mechanism's own :func:`~mechanisms.ldp.noisy_leaf_statistics`. A threshold
  test fixed in advance gives a Clopper-Pearson lower bound on epsilon. It
  stays below the accountant's epsilon at the calibrated noise, and exceeds
  it when the noise is halved.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import beta

from mechanisms import accounting, create_mechanism
from mechanisms.accounting import REPLACED_COUNTS, REPLACEMENT_SHIFT, NoiseParameters
from mechanisms.base import PrivacyEvent
from mechanisms.dp_pieces import Grid, clip_to_radius
from mechanisms.ldp import Tree, leaf_membership, noisy_leaf_statistics, simhash_prefix_codes


def level_counts(codes: np.ndarray, level: int) -> np.ndarray:
    return np.bincount(codes[:, level], minlength=2**level)


def rounded_leaf_sums(x: torch.Tensor, membership: np.ndarray, num_leaves: int, grid: Grid) -> np.ndarray:
    """The integer leaf sums the mechanism adds its noise to."""
    rounded = np.rint(x.double().numpy() / grid.step).astype(np.int64)
    sums = np.zeros((num_leaves, x.shape[1]), dtype=np.int64)
    member = membership >= 0
    np.add.at(sums, membership[member], rounded[member])
    return sums


@pytest.mark.parametrize("dim", [2, 16])
def test_a_replaced_representation_moves_what_the_accountant_charges_and_no_more(dim):
    mechanism = create_mechanism("ldp", epsilon=1.0, max_depth=6, noise_source=random.Random(0))
    generator = torch.Generator().manual_seed(1)
    data = F.normalize(torch.randn(40, dim, generator=generator), dim=1)
    hyperplanes = torch.randn(mechanism.max_depth, dim, generator=generator, dtype=torch.float64)
    center = torch.zeros(dim, dtype=torch.float64)
    grid = mechanism.grid(dim)
    # The leaves are an earlier noisy output (post-processing): fix them, here every node of level 2.
    tree = Tree(leaf_levels=np.full(4, 2), leaf_codes=np.arange(4), root_count=40.0, nodes_queried=7, depth_reached=2)
    largest_shift = 0.0
    for trial in range(200):
        replacement = F.normalize(torch.randn(1, dim, generator=generator), dim=1) * (1 + 2 * (trial % 3))
        if trial % 5 == 0:
            replacement = -data[trial % 40 : trial % 40 + 1]  # antipodal: the largest move within one leaf or across
        neighbour = data.clone()
        neighbour[trial % 40] = replacement[0]
        x, y = clip_to_radius(data.double(), mechanism.radius), clip_to_radius(neighbour.double(), mechanism.radius)
        codes_x, codes_y = simhash_prefix_codes(x, hyperplanes, center), simhash_prefix_codes(y, hyperplanes, center)
        for level in range(mechanism.max_depth + 1):
            change = level_counts(codes_y, level) - level_counts(codes_x, level)
            assert np.abs(change).max(initial=0) <= 1 and np.count_nonzero(change) <= REPLACED_COUNTS
        members_x, members_y = leaf_membership(codes_x, tree), leaf_membership(codes_y, tree)
        leaves = len(tree.leaf_codes)
        count_change = np.bincount(members_y[members_y >= 0], minlength=leaves) - np.bincount(
            members_x[members_x >= 0], minlength=leaves
        )
        assert np.abs(count_change).max(initial=0) <= 1 and np.count_nonzero(count_change) <= REPLACED_COUNTS
        shift = np.linalg.norm(rounded_leaf_sums(y, members_y, leaves, grid) - rounded_leaf_sums(x, members_x, leaves, grid))
        assert shift <= REPLACEMENT_SHIFT * grid.sensitivity
        largest_shift = max(largest_shift, shift)
    # A replacement into another leaf moves two sums by one representation each: sqrt(2) of the
    # clipped radius is reached, so the measurement is not vacuous.
    assert largest_shift >= 0.95 * math.sqrt(2) * (grid.sensitivity - math.sqrt(dim) / 2)


def _clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    lo = beta.ppf(alpha / 2, successes, trials - successes + 1) if successes > 0 else 0.0
    hi = beta.ppf(1 - alpha / 2, successes + 1, trials - successes) if successes < trials else 1.0
    return float(lo), float(hi)


def epsilon_lower_bound(hits_with: int, hits_without: int, trials: int, delta: float, alpha: float = 0.05) -> float:
    """Epsilon any (epsilon, delta)-DP mechanism must exceed to explain the hit rates (confidence 1 - alpha)."""
    p1_lo, _ = _clopper_pearson(hits_with, trials, alpha / 2)
    _, p0_hi = _clopper_pearson(hits_without, trials, alpha / 2)
    return math.log((p1_lo - delta) / p0_hi) if p1_lo > delta else 0.0


TRIALS = 200_000
#: The audit's delta: the accountant's epsilon at this delta is what the test must not beat.
AUDIT_DELTA = 1e-3


def calibrated_noise() -> NoiseParameters:
    return create_mechanism("ldp", epsilon=2.0).noise


def canary_leaf_statistics(x: torch.Tensor, membership: np.ndarray, num_leaves: int, noise: NoiseParameters, seed: int):
    """Each trial is its own leaf, so one call of the mechanism's own function releases all of them."""
    grid = Grid.for_dimension(x.shape[1], 1.0)
    return noisy_leaf_statistics(x, membership, num_leaves, grid=grid, noise=noise, source=random.Random(seed))


@pytest.mark.parametrize("noise_scale,caught", [(1.0, False), (0.5, True)])
def test_a_one_hot_sum_canary_catches_half_the_calibrated_sum_noise(noise_scale, caught):
    """Neighbours: one representation +e1 replaced by -e1 in the same leaf; the test: is coordinate 1 above a threshold?"""
    calibrated = calibrated_noise()
    claimed = accounting.epsilon_of(
        [PrivacyEvent("gaussian", {"noise_multiplier": calibrated.sum_noise_multiplier, "count": 1.0})], AUDIT_DELTA
    )
    audited = NoiseParameters(calibrated.tree_count_parameter, calibrated.leaf_count_parameter,
                              calibrated.sum_noise_multiplier * noise_scale)
    canary = torch.zeros(TRIALS, 1)
    canary[:, 0] = 1.0
    leaves = np.arange(TRIALS)
    _, with_canary = canary_leaf_statistics(canary, leaves, TRIALS, audited, seed=1)
    _, replaced = canary_leaf_statistics(-canary, leaves, TRIALS, audited, seed=2)
    threshold = 1.5 * calibrated.sum_noise_multiplier  # fixed in advance, from the claimed noise
    bound = epsilon_lower_bound(int((with_canary[:, 0] > threshold).sum()), int((replaced[:, 0] > threshold).sum()),
                                TRIALS, AUDIT_DELTA)
    assert (bound > claimed) == caught, (bound, claimed)


@pytest.mark.parametrize("noise_scale,caught", [(1.0, False), (0.5, True)])
def test_a_count_canary_moved_between_leaves_catches_half_the_calibrated_count_noise(noise_scale, caught):
    """Neighbours: the canary sits in leaf a or, replaced, in leaf b; the test: is count(a) - count(b) above a threshold?"""
    calibrated = calibrated_noise()
    claimed = accounting.epsilon_of(
        [PrivacyEvent("discrete_laplace", {"noise_parameter": calibrated.leaf_count_parameter, "sensitivity": 1.0,
                                           "count": 1.0})], AUDIT_DELTA
    )
    audited = NoiseParameters(calibrated.tree_count_parameter, calibrated.leaf_count_parameter / noise_scale,
                              calibrated.sum_noise_multiplier)
    canary = torch.zeros(TRIALS, 1)
    in_a, in_b = 2 * np.arange(TRIALS), 2 * np.arange(TRIALS) + 1
    counts_a, _ = canary_leaf_statistics(canary, in_a, 2 * TRIALS, audited, seed=3)
    counts_b, _ = canary_leaf_statistics(canary, in_b, 2 * TRIALS, audited, seed=4)
    threshold = 1.0 / calibrated.leaf_count_parameter  # one calibrated noise scale, fixed in advance
    statistic_a = counts_a[0::2] - counts_a[1::2]
    statistic_b = counts_b[0::2] - counts_b[1::2]
    bound = epsilon_lower_bound(int((statistic_a > threshold).sum()), int((statistic_b > threshold).sum()),
                                TRIALS, AUDIT_DELTA)
    assert (bound > claimed) == caught, (bound, claimed)
