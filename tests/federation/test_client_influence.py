"""One client weighs no more than an honest client of its mechanism could: the bound is its memory, not its size.

A kanon client hands its mechanism at most ``memory_size`` images, so its
release weighs at most that much and its credited ``k`` is at most that over
its vectors, however large its partition (`benchmarks/client_influence.py`
measures what the cap buys in the global clustering).
"""

from __future__ import annotations

import numpy as np
import pytest

from mechanisms import get_mechanism_class
from privfed.config import build_config
from privfed.federation.reply_checks import ReplyRules
from privfed.privacy.dp_sgd_plan import poisson_memory_bound
from privfed.run.plan import plan_run
from tests.federation.honest_round import HonestRound, Node, honest_round
from tests.federation.test_strategy import vectors_of, weights_of, with_release

MEMORY = 16


@pytest.fixture(scope="module")
def round_(tmp_path_factory) -> HonestRound:
    config = build_config(
        dataset="shapes:300", num_clients=4, participation=0.5, backbone="resnet8", projection_dim=16,
        local_epochs=1, batch_size=8, memory_size=MEMORY, num_local_centroids=2, num_global_centroids=4,
        kanon_min_k=2, rounds=1, secagg=False, seed=0,
    )
    return honest_round(config, tmp_path_factory.mktemp("influence") / "run")


def test_every_client_holds_more_images_than_its_memory(round_):
    """What makes the cases below meaningful: the old bound (the client's size) was looser than the memory."""
    assert min(round_.plan.client_sizes[c] for c in (0, 1)) > 2 * MEMORY


def test_an_honest_release_weighs_at_most_the_memory_and_passes(round_):
    replies = [(Node(100 + c), round_.reply(c)) for c in (0, 1)]
    assert all(float(weights_of(res).sum()) <= MEMORY for _, res in replies)
    round_.reports.clear()
    round_.strategy.aggregate_fit(round_.server_round, replies, [])
    (report,) = round_.reports
    assert report.rejected == [] and report.completed == 2


def test_a_release_weighing_the_clients_size_is_rejected(round_):
    honest = round_.reply(1)
    size = round_.plan.client_sizes[1]
    weights = weights_of(honest)
    heavy = (weights * (size / weights.sum())).astype(np.float32)  # honest directions, the weight of every image it holds
    round_.reports.clear()
    round_.strategy.aggregate_fit(round_.server_round, [(Node(100), round_.reply(0)), (Node(101), with_release(honest, weights=heavy))], [])
    (report,) = round_.reports
    assert [(r.client, r.reason) for r in report.rejected] == [(1, f"release weights are negative or total more than {MEMORY}")]


def test_the_credited_k_is_at_most_the_memory_over_the_vectors(round_):
    honest = round_.reply(0)
    count = len(vectors_of(honest))
    claimed = with_release(honest, weights=np.full(count, MEMORY / count, np.float32))
    round_.reports.clear()
    round_.strategy.aggregate_fit(round_.server_round, [(Node(100), claimed), (Node(101), round_.reply(1))], [])
    (report,) = round_.reports
    (client, release), _ = report.releases
    assert client == 0 and release.guarantee.k == MEMORY // count


def test_each_mechanism_declares_its_largest_honest_k():
    kanon, ldp, reps = (get_mechanism_class(name) for name in ("kanon", "ldp", "reps"))
    assert kanon.max_k(num_reps=128, num_vectors=8, params={}) == 16
    assert kanon.max_k(num_reps=128, num_vectors=0, params={}) is None
    assert ldp.max_k(num_reps=128, num_vectors=8, params={}) is None and reps.max_k(num_reps=128, num_vectors=8, params={}) is None


def test_under_dp_sgd_the_bound_is_a_binomial_tail_below_the_clients_size(tiny_config, tmp_path):
    """A DP-SGD client's memory is a Poisson sample with no cap (memory_sampling.poisson_memory), but its size is
    Binomial: the bound is its tail at MEMORY_BOUND_FAILURE, not the whole client (the bound was its size)."""
    plain = plan_run(tiny_config.replace(memory_size=8, out=str(tmp_path / "plain")))
    private = plan_run(tiny_config.replace(memory_size=8, dp_sgd=True, dp_sgd_epsilon=8.0, out=str(tmp_path / "private")))
    size = plain.client_sizes[0]
    assert ReplyRules.of(plain, get_mechanism_class("kanon")).most_reps(size) == 8
    bound = ReplyRules.of(private, get_mechanism_class("kanon")).most_reps(size)
    assert bound == poisson_memory_bound(size, 8) and 8 < bound < size
