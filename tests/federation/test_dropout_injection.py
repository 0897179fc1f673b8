"""The dropout plan is a pure function of its seed, and its mod fails exactly the planned client at the planned stage."""

from __future__ import annotations

import pytest
from flwr.app import Message
from flwr.app.message_type import MessageType
from flwr.common import ConfigRecord, Context, Metadata, RecordDict
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Stage

from benchmarks.dropout_injection import (
    FAILURE_STAGES,
    DropoutPlan,
    InjectedDropout,
    dropout_mod,
    expected_round,
)
from privfed.secagg.identity import CONSISTENCY_STAGE


def stage_message(stage: str | None, flower_round: int) -> Message:
    records = {} if stage is None else {RECORD_KEY_CONFIGS: ConfigRecord({"stage": stage})}
    metadata = Metadata(run_id=1, message_id="m", src_node_id=0, dst_node_id=1, reply_to_message_id="",
                        group_id=str(flower_round), created_at=0.0, ttl=60.0, message_type=MessageType.TRAIN)
    return Message(metadata=metadata, content=RecordDict(records))


def node(partition: int) -> Context:
    return Context(run_id=1, node_id=1, node_config={"partition-id": partition}, state=RecordDict(), run_config={})


def test_the_same_seed_fails_the_same_clients_at_the_same_stages():
    draws = lambda seed: [DropoutPlan(0.3, seed=seed).failing_stage(r, c) for r in range(1, 30) for c in range(20)]
    assert draws(4) == draws(4)
    assert draws(4) != draws(5)


def test_the_rate_and_the_stages_are_what_the_plan_says():
    stages = [DropoutPlan(0.3, seed=0).failing_stage(r, c) for r in range(1, 101) for c in range(100)]
    failed = [s for s in stages if s is not None]
    assert abs(len(failed) / len(stages) - 0.3) < 0.02  # 10,000 draws: the standard error is 0.005
    for stage in FAILURE_STAGES:
        assert abs(failed.count(stage) / len(failed) - 1 / len(FAILURE_STAGES)) < 0.04
    assert all(DropoutPlan(0.0).failing_stage(r, 0) is None for r in range(100))
    assert {DropoutPlan(1.0, stages=(Stage.UNMASK,)).failing_stage(r, 0) for r in range(100)} == {Stage.UNMASK}


@pytest.mark.parametrize("bad", [dict(rate=-0.1), dict(rate=1.5), dict(rate=0.3, stages=()), dict(rate=0.3, stages=("share",))])
def test_a_bad_plan_is_refused(bad):
    with pytest.raises(ValueError):
        DropoutPlan(**bad)


def test_the_mod_fails_only_the_planned_client_at_the_planned_stage():
    plan = DropoutPlan(0.5, seed=3)
    flower_round, client = next((r, c) for r in range(2, 50) for c in range(10) if plan.failing_stage(r, c) is not None)
    planned = plan.failing_stage(flower_round, client)
    mod = dropout_mod(plan)
    passed = lambda msg, context: msg  # the rest of the ClientApp
    with pytest.raises(InjectedDropout, match=planned):
        mod(stage_message(planned, flower_round), node(client), passed)
    for other_stage in [s for s in FAILURE_STAGES if s != planned] + [None]:
        message = stage_message(other_stage, flower_round)
        assert mod(message, node(client), passed) is message


def test_expected_round_counts_who_replied_and_who_survived():
    plan = DropoutPlan(0.5, seed=1)
    sampled = list(range(20))
    stages = {c: plan.failing_stage(7, c) for c in sampled}
    expected = expected_round(plan, 7, sampled, threshold=11)
    early = sum(s in (Stage.SETUP, Stage.SHARE_KEYS) for s in stages.values())
    assert 20 - early >= 11  # this round gets past the key exchange
    assert expected.released == {c for c, s in stages.items() if s in (None, CONSISTENCY_STAGE, Stage.UNMASK)}
    assert expected.survivors == sum(s is None for s in stages.values())
    assert expected.completes == (expected.survivors >= 11)
    assert not expected_round(plan, 7, sampled, threshold=expected.survivors + 1).completes
    assert expected_round(plan, 7, sampled, threshold=expected.survivors).completes


def test_a_round_that_loses_too_many_clients_before_masking_releases_nothing():
    plan = DropoutPlan(0.5, seed=1)
    sampled = list(range(20))
    stages = [plan.failing_stage(7, c) for c in sampled]
    early = sum(s in (Stage.SETUP, Stage.SHARE_KEYS) for s in stages)
    halted = expected_round(plan, 7, sampled, threshold=20 - early + 1)
    assert halted.released == frozenset() and not halted.completes
