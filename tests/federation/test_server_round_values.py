"""What a deviating server can still do with the keys it may send (task, round, centroids): no second release.

Issue 34 left the server only the round's values. Each test sends them bent
as a deviating server would (another type for the round index, one outside
the run, an init task in a later round, centroids it picked) and checks that
the client releases no more than one reply per charged round, at its own
calibration.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from privfed.data.federated import FederatedSplit
from privfed.federation.client import ClientRoundFailed
from privfed.federation.messages import tensor_to_bytes
from privfed.orchestra.client_update import DP_SGD_METRICS
from privfed.privacy.client_guard import RoundRefused
from privfed.run.plan import plan_run
from tests.federation import honest_round
from tests.federation.honest_round import declared_client, decode_release, small_round_config
from tests.federation.test_declared_run import PARTITION, client, instructions


@pytest.fixture
def plan(tiny_config, tmp_path):
    return plan_run(tiny_config.replace(mechanism="ldp", epsilon=2.0, out=str(tmp_path / "run")))


def charged(tmp_path) -> list[tuple[int, str]]:
    path = tmp_path / "state" / f"privfed-ledger-partition-{PARTITION}.jsonl"
    if not path.exists():
        return []
    return [(entry["round"], entry["kind"]) for entry in map(json.loads, path.read_text().splitlines())]


def with_config(ins, **changes):
    return dataclasses.replace(ins, config={**ins.config, **changes})


@pytest.mark.parametrize("again", [1.0, "1", True, 1.5, b"1"])
def test_an_answered_round_named_by_another_type_gets_no_second_release(plan, tmp_path, again):
    """``int(round)`` maps these to round 1; the digest tells them apart, so the client refuses instead of computing."""
    ins = instructions(plan)
    assert ins.config["round"] == 1
    client(plan, tmp_path).fit(ins)
    with pytest.raises(RoundRefused, match="answered already, for other instructions"):
        client(plan, tmp_path).fit(with_config(ins, round=again))
    assert charged(tmp_path) == [(1, "release")]


@pytest.mark.parametrize("index", [-1, 2, 2**62])
def test_a_round_outside_the_declared_run_is_refused_before_anything_is_charged(plan, tmp_path, index):
    with pytest.raises(RoundRefused, match="outside the declared run's rounds"):
        client(plan, tmp_path).fit(with_config(instructions(plan), round=index))
    assert charged(tmp_path) == []


@pytest.mark.parametrize("index", [float("nan"), float("inf"), "one", None])
def test_a_round_that_is_no_integer_computes_nothing_and_charges_nothing(plan, tmp_path, index):
    with pytest.raises((ValueError, OverflowError, TypeError)):
        client(plan, tmp_path).fit(with_config(instructions(plan), round=index))
    assert charged(tmp_path) == []


def test_a_later_round_cannot_be_sent_as_init_to_release_without_a_charge(plan, tmp_path):
    """A releasing mechanism's init round is charged like a training round, whatever its index; the round it used
    is not answered again, as init or as training."""
    init = with_config(instructions(plan, task="init"), round=1)
    res = client(plan, tmp_path).fit(init)
    assert decode_release(res.metrics).events == client(plan, tmp_path).declared.guard.budget.release_events
    assert charged(tmp_path) == [(1, "release")]
    with pytest.raises(RoundRefused):
        client(plan, tmp_path).fit(instructions(plan))  # training in round 1 now
    with pytest.raises(RoundRefused, match="comes after round 1"):
        client(plan, tmp_path).fit(instructions(plan, task="init"))  # round 0, after round 1
    assert charged(tmp_path) == [(1, "release")]


@pytest.mark.parametrize("scale", [1e30, -1e30])
def test_centroids_the_server_picks_do_not_change_the_releases_cost(plan, tmp_path, scale):
    """Huge global centroids move ldp's SimHash centre far away; the release still costs the declared events."""
    ins = instructions(plan)
    centroids = torch.full((plan.config.num_global_centroids, plan.config.projection_dim), scale)
    res = client(plan, tmp_path).fit(with_config(ins, centroids=tensor_to_bytes(centroids)))
    assert decode_release(res.metrics).events == client(plan, tmp_path).declared.guard.budget.release_events
    assert charged(tmp_path) == [(1, "release")]


def test_nan_centroids_fail_the_round_once_charged_and_draw_nothing_new_when_asked_again(plan, tmp_path):
    ins = instructions(plan)
    nan = torch.full((plan.config.num_global_centroids, plan.config.projection_dim), float("nan"))
    bad = with_config(ins, centroids=tensor_to_bytes(nan))
    for _ in range(2):
        with pytest.raises(ClientRoundFailed):
            client(plan, tmp_path).fit(bad)
    with pytest.raises(RoundRefused, match="answered already"):
        client(plan, tmp_path).fit(ins)
    assert charged(tmp_path) == [(1, "release")]


def test_an_uncharged_init_round_of_an_aggregated_mechanism_sends_nothing_from_the_data_at_any_index(tmp_path):
    """ddp-sums charges no init round (nothing to share into), so the server may ask for one at any index and as
    often as it likes: each reply must then hold only public values."""
    config = small_round_config(secagg=True, mechanism="ddp-sums", epsilon=10.0, participation=1.0, rounds=2)
    ins = honest_round.instructions(config, train=False)
    for index in (0, 1, 2):
        res = declared_client(config, PARTITION, tmp_path / "state").fit(with_config(ins, round=index))
        assert res.parameters.tensors == [] and res.num_examples == FederatedSplit.of(config).client_sizes()[PARTITION]
        assert set(res.metrics) == {"client_id", "round", "dp_sgd_events"} and res.metrics["dp_sgd_events"] == "[]"
    assert charged(tmp_path) == []


def test_the_client_draws_dp_sgd_batches_and_noise_from_no_value_the_server_knows(tiny_config, tmp_path):
    """The same declared run and instructions give the same update without DP-SGD and another one with it, whose
    plaintext metrics hold no loss (only counts fixed by the client's size, and timings)."""
    for dp_sgd in (False, True):
        config = plan_run(tiny_config.replace(
            dp_sgd=dp_sgd, dp_sgd_epsilon=8.0 if dp_sgd else None, secagg=False, report_client_metrics=True,
            out=str(tmp_path / f"run-{dp_sgd}"),
        )).config
        ins = honest_round.instructions(config)
        a, b = (declared_client(config, PARTITION, tmp_path / f"state-{dp_sgd}-{i}").fit(ins) for i in (0, 1))
        same = a.parameters.tensors == b.parameters.tensors
        assert same != dp_sgd
        if dp_sgd:
            plain = {k for k, v in a.metrics.items() if not k.startswith("release_")} - {"client_id", "round", "dp_sgd_events"}
            assert plain <= set(DP_SGD_METRICS) and json.loads(a.metrics["dp_sgd_events"])


def test_a_new_run_id_gets_a_new_release_only_for_a_new_charge_and_no_more_than_the_budget(plan, tmp_path):
    """The stored reply answers its own run only: the same round under another run id is computed again and charged
    again, and the budget (two releases here) spans the runs."""
    ins = instructions(plan)
    client(plan, tmp_path).fit(ins)
    declared_client(plan.config, PARTITION, tmp_path / "state", run=2).fit(ins)
    assert charged(tmp_path) == [(1, "release"), (1, "release")]
    with pytest.raises(RoundRefused, match="budget"):
        declared_client(plan.config, PARTITION, tmp_path / "state", run=3).fit(ins)
    assert len(charged(tmp_path)) == 2
