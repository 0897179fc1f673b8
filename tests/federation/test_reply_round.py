"""A reply names the round it answers, and the server refuses one for another round (issue 28, item 7).

Without it, a client's reply to round r, delivered late or replayed in round r + 1, would be clustered and
applied again, to a model it was not computed from.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from flwr.common import FitRes

from privfed.federation.reply_checks import RejectedReply, check_round
from tests.federation.honest_round import Node, honest_round, small_round_config


def with_round(res: FitRes, value: object) -> FitRes:
    """A copy of ``res`` that claims to answer round ``value`` (None: names no round)."""
    metrics = {k: v for k, v in res.metrics.items() if k != "round"}
    return dataclasses.replace(res, metrics=metrics if value is None else {**metrics, "round": value})


@pytest.fixture(scope="module")
def config():
    return small_round_config(rounds=2)


def test_the_client_names_the_round_it_answers(config, tmp_path):
    round_ = honest_round(config, tmp_path / "run")
    assert round_.reply(0).metrics["round"] == round_.strategy.orchestra_round(round_.server_round) == 1


@pytest.mark.parametrize(
    ("claimed", "reason"),
    [(0, "answers round 0, not round 1"), (2, "answers round 2, not round 1"), (None, "missing"), ("1", "not an integer"),
     (True, "not an integer")],
)
def test_a_reply_for_another_round_is_rejected_and_the_round_goes_on(config, tmp_path, claimed, reason):
    round_ = honest_round(config, tmp_path / "run")
    replies = [(Node(100), round_.reply(0)), (Node(101), with_round(round_.reply(1), claimed))]
    round_.strategy.aggregate_fit(round_.server_round, replies, [])
    (report,) = round_.reports
    assert [r.client for r in report.rejected] == [1] and reason in report.rejected[0].reason
    assert report.completed == 1 and [c for c, _ in report.releases] == [0]


def test_under_secagg_a_reply_for_another_round_is_kept_out_of_the_masked_sum(config, tmp_path):
    round_ = honest_round(config.replace(secagg=True), tmp_path / "run")
    masked = [np.zeros(shape, dtype=np.int64) for shape in round_.strategy.masked_vector_shapes()]
    assert round_.strategy.check_masked_reply(100, round_.reply(0), masked) is None
    got = round_.strategy.check_masked_reply(101, with_round(round_.reply(1), 0), masked)
    assert got == "it answers round 0, not round 1"


def test_check_round_alone():
    check_round({"round": 3}, 3)
    with pytest.raises(RejectedReply, match="answers round 2, not round 3"):
        check_round({"round": 2}, 3)
