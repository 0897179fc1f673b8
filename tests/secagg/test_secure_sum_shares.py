"""An aggregated mechanism's shares in SecAgg+ rounds (tests/secagg/harness.py): summed, never in plaintext.

privfed's real client mod moves each node's share from its plaintext reply
into its masked vector; privfed's workflow splits the shares' sum off the
unmasked sum and hands it to the strategy with the number of shares in it.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common.secure_aggregation.secaggplus_constants import Stage

from benchmarks.secagg_harness import run_round
from privfed.secagg.masking import SHARE_KEY
from tests.secagg.harness import drops_at, in_process_secagg  # noqa: F401 (fixture)

MODULUS = 2**32
LENGTH = 33


pytestmark = pytest.mark.usefixtures("in_process_secagg")


def shares_for(nodes: list[int], seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.integers(0, MODULUS, size=LENGTH, dtype=np.int64) for n in nodes}


def updates_for(nodes: list[int]) -> dict[int, tuple[list[np.ndarray], int]]:
    return {n: ([np.full(3, 0.1 * n)], 10) for n in nodes}


@pytest.mark.parametrize("dropped", [[], [5], [2, 5]])
def test_the_survivors_shares_sum_mod_m_with_the_count_of_shares_in_it(dropped):
    nodes = [1, 2, 3, 4, 5, 6]
    shares = shares_for(nodes)
    outcome = run_round(
        updates_for(nodes), shares=6, threshold=4, client_shares=shares,
        behaviours={n: drops_at(Stage.COLLECT_MASKED_VECTORS) for n in dropped},
    )
    assert outcome.completed
    total, num_summed = outcome.strategy.secure_sum
    survivors = [n for n in nodes if n not in dropped]
    assert num_summed == len(survivors)
    assert np.array_equal(total, np.mod(sum(shares[n] for n in survivors), MODULUS))
    # The update's mean is unaffected by the share riding behind it.
    assert outcome.mean == pytest.approx(np.full(3, 0.1 * np.mean(survivors)), abs=1e-3)


def test_a_share_travels_only_masked():
    nodes = [1, 2, 3, 4]
    shares = shares_for(nodes, seed=1)
    outcome = run_round(updates_for(nodes), shares=4, threshold=3, client_shares=shares)
    for node, masked in outcome.grid.masked.items():
        assert masked[-1].shape == (LENGTH,) and not np.array_equal(masked[-1], shares[node])
    # What reached the strategy as each client's reply carries no share in its metrics.
    assert all(SHARE_KEY not in res.metrics for _, res in outcome.strategy.results)


def test_a_round_that_loses_more_than_the_threshold_allows_hands_over_no_sum():
    nodes = [1, 2, 3, 4, 5]
    outcome = run_round(
        updates_for(nodes), shares=5, threshold=4, client_shares=shares_for(nodes),
        behaviours={n: drops_at(Stage.COLLECT_MASKED_VECTORS) for n in (1, 2)},
    )
    assert not outcome.completed and outcome.strategy.secure_sum is None
