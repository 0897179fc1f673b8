"""The strategy's aggregation (FedAvg of plaintext deltas, or the decoded secure aggregate) and its guard against bad replies.

The fuzz cases tamper with a real client's honest reply and feed it, next to
another honest reply, through the real strategy: each must be rejected with
a counted reason while the round completes and the global state stays finite.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable

import numpy as np
import pytest
import torch
from flwr.common import FitRes, bytes_to_ndarray, ndarray_to_bytes, ndarrays_to_parameters, parameters_to_ndarrays

from privfed.federation.messages import RELEASE_KEYS
from privfed.orchestra.model_state import shared_state, state_delta
from privfed.secagg.encoding import encode_metrics, encode_update, secure_sum_shapes
from tests.federation.honest_round import HonestRound, Node, honest_round, small_round_config


def with_metrics(res: FitRes, **changes) -> FitRes:
    """A copy of ``res`` with metrics changed (a value of None removes the key)."""
    metrics = {**res.metrics, **changes}
    return dataclasses.replace(res, metrics={k: v for k, v in metrics.items() if v is not None})


def with_arrays(res: FitRes, arrays: list[np.ndarray]) -> FitRes:
    return dataclasses.replace(res, parameters=ndarrays_to_parameters(arrays))


def with_release(res: FitRes, vectors: np.ndarray | None = None, weights: np.ndarray | None = None) -> FitRes:
    changes = {}
    if vectors is not None:
        changes["release_vectors"] = ndarray_to_bytes(vectors)
    if weights is not None:
        changes["release_weights"] = ndarray_to_bytes(weights)
    return with_metrics(res, **changes)


def vectors_of(res: FitRes) -> np.ndarray:
    return bytes_to_ndarray(res.metrics["release_vectors"])


def weights_of(res: FitRes) -> np.ndarray:
    return bytes_to_ndarray(res.metrics["release_weights"])


def delta_of(res: FitRes) -> list[np.ndarray]:
    return parameters_to_ndarrays(res.parameters)


def poisoned(values: np.ndarray, value: float) -> np.ndarray:
    values = values.copy()
    values.flat[0] = value
    return values


def unit_rows(count: int, dim: int) -> np.ndarray:
    rows = np.random.default_rng(0).normal(size=(count, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def config():
    return small_round_config()


@pytest.fixture(scope="module")
def honest(config, tmp_path_factory) -> dict[int, FitRes]:
    """Clients 0 and 1's real replies to a training round (kanon, no SecAgg+)."""
    round_ = honest_round(config, tmp_path_factory.mktemp("honest") / "run")
    return {client: round_.reply(client) for client in (0, 1)}


@pytest.fixture
def fresh(config, tmp_path) -> HonestRound:
    return honest_round(config, tmp_path / "run")


def global_state_is_finite(round_: HonestRound) -> bool:
    state = round_.strategy.server.global_state()
    centroids = round_.strategy.server.centroids
    return all(bool(torch.isfinite(v.float()).all()) for v in state.values()) and bool(torch.isfinite(centroids).all())


Tamper = Callable[[FitRes, int], FitRes]
DIM = 16

#: (case, how client 1's honest reply is spoilt, the reason the server must give). ``size`` is the client's size.
HOSTILE_REPLIES: list[tuple[str, Tamper, str]] = [
    ("nan vector", lambda r, size: with_release(r, poisoned(vectors_of(r), np.nan)), "NaN or Inf"),
    ("inf vector", lambda r, size: with_release(r, poisoned(vectors_of(r), np.inf)), "NaN or Inf"),
    ("nan weight", lambda r, size: with_release(r, weights=poisoned(weights_of(r), np.nan)), "NaN or Inf"),
    ("wrong dimension", lambda r, size: with_release(r, unit_rows(4, DIM + 1)), r"shape \(4, 17\)"),
    ("flat vectors", lambda r, size: with_release(r, vectors_of(r).ravel()), "shape"),
    ("a million vectors", lambda r, size: with_release(r, unit_rows(10**6, DIM), np.ones(10**6, np.float32)),
     "1000000 vectors; kanon sends at most 4"),
    ("zero weights", lambda r, size: with_release(r, weights=np.zeros(4, np.float32)), "below the run's min_k"),
    ("1e9 weights", lambda r, size: with_release(r, weights=np.full(4, 1e9, np.float32)), "total more than"),
    ("negative weights", lambda r, size: with_release(r, weights=-weights_of(r)), "negative"),
    ("weights of another length", lambda r, size: with_release(r, weights=np.ones(3, np.float32)), "weights have shape"),
    ("float64 vectors", lambda r, size: with_release(r, vectors_of(r).astype(np.float64)), "not float32"),
    ("integer vectors", lambda r, size: with_release(r, np.ones((4, DIM), np.int32)), "not float32"),
    ("vectors of norm 2", lambda r, size: with_release(r, 2 * vectors_of(r)), "not unit-norm"),
    ("zero vectors", lambda r, size: with_release(r, np.zeros((4, DIM), np.float32)), "not unit-norm"),
    ("truncated vectors", lambda r, size: with_metrics(r, release_vectors=r.metrics["release_vectors"][:-7]),
     "release_vectors is not a readable array"),
    ("truncated weights", lambda r, size: with_metrics(r, release_weights=r.metrics["release_weights"][:20]),
     "release_weights is not a readable array"),
    ("garbage bytes", lambda r, size: with_metrics(r, release_vectors=b"\x00garbage" * 9), "not a readable array"),
    ("vectors as text", lambda r, size: with_metrics(r, release_vectors="[[1, 0]]"), "not bytes"),
    ("no release", lambda r, size: with_metrics(r, release_vectors=None), "release_vectors is missing"),
    ("guarantee not json", lambda r, size: with_metrics(r, release_guarantee="{kind: "), "release_guarantee is not JSON"),
    ("guarantee of another kind", lambda r, size: with_metrics(
        r, release_guarantee=json.dumps({"kind": "none", "statement": "trust me"})), "claims 'none'"),
    ("guarantee with a text k", lambda r, size: with_metrics(
        r, release_guarantee=json.dumps({"kind": "k-anonymity", "statement": "s", "k": "many"})), "k is 'many'"),
    ("guarantee with extra fields", lambda r, size: with_metrics(
        r, release_guarantee=json.dumps({"kind": "k-anonymity", "statement": "s", "admin": True})), "not a guarantee"),
    ("events not json", lambda r, size: with_metrics(r, release_events="[{"), "release_events is not JSON"),
    ("events the plan does not have", lambda r, size: with_metrics(
        r, release_events=json.dumps([{"name": "gaussian", "params": {"sigma": 1.0}}])), "differ from the plan"),
    ("a negative event count", lambda r, size: with_metrics(
        r, release_events=json.dumps([{"name": "gaussian", "params": {"sigma": 1.0, "count": -9}}])), "count"),
    ("dp-sgd events as a number", lambda r, size: with_metrics(r, dp_sgd_events="7"), "not a list"),
    ("dp-sgd costs without dp-sgd", lambda r, size: with_metrics(
        r, dp_sgd_events=json.dumps([{"name": "poisson_gaussian", "params": {"noise_multiplier": 1.0}}])),
     "DP-SGD costs"),
    ("no client_id", lambda r, size: with_metrics(r, client_id=None), "client_id is missing"),
    ("client_id as text", lambda r, size: with_metrics(r, client_id="1"), "not an integer"),
    ("client_id as a bool", lambda r, size: with_metrics(r, client_id=True), "not an integer"),
    ("another client's id", lambda r, size: with_metrics(r, client_id=3), "not the partition 1"),
    ("negative num_examples", lambda r, size: dataclasses.replace(r, num_examples=-5), "num_examples -5"),
    ("1e9 num_examples", lambda r, size: dataclasses.replace(r, num_examples=10**9), "num_examples"),
    ("one example more", lambda r, size: dataclasses.replace(r, num_examples=size + 1), "num_examples"),
    ("a loss the run does not report", lambda r, size: with_metrics(r, loss=1.0),
     r"training metrics \['loss'\], which this run does not report"),
    ("an unknown metric", lambda r, size: with_metrics(r, admin_override=1.0), "unknown metrics"),
    ("nan in the delta", lambda r, size: with_arrays(r, [poisoned(delta_of(r)[0], np.nan), *delta_of(r)[1:]]),
     "delta array 0 holds NaN or Inf"),
    ("delta of another shape", lambda r, size: with_arrays(r, [delta_of(r)[0][:1], *delta_of(r)[1:]]), "delta array 0"),
    ("a delta array missing", lambda r, size: with_arrays(r, delta_of(r)[:-1]), "arrays, not"),
    ("an integer delta", lambda r, size: with_arrays(r, [a.astype(np.int64) for a in delta_of(r)]), "not float"),
    ("a float64 delta of 1e300", lambda r, size: with_arrays(r, [np.full(a.shape, 1e300) for a in delta_of(r)]),
     "not float32"),
    ("a float16 delta", lambda r, size: with_arrays(r, [a.astype(np.float16) for a in delta_of(r)]), "not float32"),
    ("a delta near float32's limit", lambda r, size: with_arrays(
        r, [np.full(a.shape, 3e38, np.float32) for a in delta_of(r)]), "moves a value by more than"),
    ("-inf in the delta", lambda r, size: with_arrays(r, [poisoned(delta_of(r)[0], -np.inf), *delta_of(r)[1:]]),
     "delta array 0 holds NaN or Inf"),
    ("a large negative delta", lambda r, size: with_arrays(
        r, [np.full(a.shape, -2e4, np.float32) for a in delta_of(r)]), "delta array 0 moves a value by more than"),
    ("events too long", lambda r, size: with_metrics(r, release_events="[" * 60_000 + "]" * 60_000), "characters long"),
    ("events nested too deep", lambda r, size: with_metrics(r, release_events="[" * 40_000 + "]" * 40_000),
     "unreadable reply"),
    ("an event number of 5000 digits", lambda r, size: with_metrics(
        r, release_events='[{"name": "x", "params": {"count": 1' + "0" * 5000 + "}}]"), "unreadable reply"),
    ("no k, and weights of 0", lambda r, size: with_metrics(
        with_release(r, weights=np.zeros(4, np.float32)),
        release_guarantee=json.dumps({"kind": "k-anonymity", "statement": "s"})), "without its k"),
    ("k as a bool", lambda r, size: with_metrics(
        r, release_guarantee=json.dumps({"kind": "k-anonymity", "statement": "s", "k": True})), "k is True"),
    ("epsilon NaN", lambda r, size: with_metrics(
        r, release_guarantee=json.dumps({"kind": "k-anonymity", "statement": "s", "k": 8, "epsilon": float("nan")})),
     "epsilon is nan"),
    ("truncated delta bytes", lambda r, size: dataclasses.replace(
        r, parameters=dataclasses.replace(r.parameters, tensors=[t[:-5] for t in r.parameters.tensors])),
     "model delta is not readable"),
]


@pytest.mark.parametrize(("case", "tamper", "reason"), HOSTILE_REPLIES, ids=[c for c, _, _ in HOSTILE_REPLIES])
def test_a_hostile_reply_is_rejected_with_its_reason_and_the_round_goes_on(fresh, honest, case, tamper, reason):
    size = fresh.plan.client_sizes[1]
    fresh.strategy.aggregate_fit(fresh.server_round, [(Node(100), honest[0]), (Node(101), tamper(honest[1], size))], [])
    (report,) = fresh.reports
    assert [r.client for r in report.rejected] == [1]
    assert report.rejected[0].reason and re.search(reason, report.rejected[0].reason), report.rejected[0].reason
    assert report.completed == 1 and [c for c, _ in report.releases] == [0]
    assert global_state_is_finite(fresh)


@pytest.mark.parametrize(("value", "reason"), [(float("nan"), "metric loss is nan"), ("low", "metric loss is 'low'")])
def test_in_a_run_that_reports_metrics_one_that_is_not_a_finite_number_is_rejected(config, tmp_path, value, reason):
    round_ = honest_round(config.replace(report_client_metrics=True), tmp_path / "run")
    replies = [(Node(100), round_.reply(0)), (Node(101), with_metrics(round_.reply(1), loss=value))]
    round_.strategy.aggregate_fit(round_.server_round, replies, [])
    (report,) = round_.reports
    assert [(r.client, r.reason) for r in report.rejected] == [(1, f"{reason}, not a finite number")]
    assert report.client_metrics[0]["loss"] > 0  # the honest reply's loss, as its client reported it


def test_the_honest_replies_pass_and_are_averaged_by_size(fresh, honest):
    start = shared_state(fresh.strategy.server.network)
    ones = [np.ones_like(a) for a in delta_of(honest[0])]
    replies = [(Node(100), with_arrays(honest[0], ones)), (Node(101), with_arrays(honest[1], [3 * a for a in ones]))]
    fresh.strategy.aggregate_fit(fresh.server_round, replies, [])
    (report,) = fresh.reports
    assert report.rejected == [] and report.completed == 2
    n0, n1 = fresh.plan.client_sizes[0], fresh.plan.client_sizes[1]
    expected = (n0 * 1 + n1 * 3) / (n0 + n1)
    for key, moved in state_delta(shared_state(fresh.strategy.server.network), start).items():
        assert torch.allclose(moved, torch.full_like(moved, expected), atol=1e-6), key


def test_replies_arrive_in_any_order_and_are_folded_in_client_order(fresh, honest):
    fresh.strategy.aggregate_fit(fresh.server_round, [(Node(101), honest[1]), (Node(100), honest[0])], [])
    (report,) = fresh.reports
    assert [c for c, _ in report.releases] == [0, 1]


def test_two_replies_for_one_client_are_both_dropped(fresh, honest):
    replies = [(Node(100), honest[0]), (Node(101), honest[1]), (Node(101), honest[1])]
    fresh.strategy.aggregate_fit(fresh.server_round, replies, [])
    (report,) = fresh.reports
    assert [r.client for r in report.rejected] == [1] and "more than one reply" in report.rejected[0].reason
    assert [c for c, _ in report.releases] == [0]


def test_a_node_that_was_not_asked_is_rejected(fresh, honest):
    unasked = with_metrics(honest[1], client_id=3)  # node 103 holds partition 3, which was not sampled
    fresh.strategy.aggregate_fit(fresh.server_round, [(Node(100), honest[0]), (Node(103), unasked)], [])
    (report,) = fresh.reports
    assert [(r.client, r.reason) for r in report.rejected] == [(None, "node 103 was not asked for a reply this round")]


def test_a_round_with_no_usable_reply_is_reported_unusable_with_the_model_unchanged(fresh, honest):
    """The driver then charges the rejected client and stops the run (tests/federation/test_failing_rounds.py)."""
    start = shared_state(fresh.strategy.server.network)
    fresh.strategy.aggregate_fit(fresh.server_round, [(Node(100), with_metrics(honest[0], client_id=None))], [])
    (report,) = fresh.reports
    assert report.completed == 0 and [r.client for r in report.rejected] == [0]
    assert re.search("no usable reply.*client_id is missing", report.unusable)
    assert all(torch.equal(v, start[k]) for k, v in shared_state(fresh.strategy.server.network).items())


def test_a_rejection_reason_quoting_the_client_is_kept_short(fresh, honest):
    huge = with_metrics(honest[1], client_id="x" * 1_000_000)
    fresh.strategy.aggregate_fit(fresh.server_round, [(Node(100), honest[0]), (Node(101), huge)], [])
    (report,) = fresh.reports
    (rejection,) = report.rejected
    assert rejection.reason.startswith("client_id is missing or not an integer") and len(rejection.reason) <= 200


def test_a_release_the_method_does_not_make_is_rejected(config, tmp_path, honest):
    round_ = honest_round(config.replace(method="rotpred"), tmp_path / "run")
    with_a_release = with_metrics(round_.reply(1), **{key: honest[1].metrics[key] for key in RELEASE_KEYS if key in honest[1].metrics})
    round_.strategy.aggregate_fit(round_.server_round, [(Node(100), round_.reply(0)), (Node(101), with_a_release)], [])
    (report,) = round_.reports
    assert [r.client for r in report.rejected] == [1] and "releases nothing" in report.rejected[0].reason
    assert report.releases == []


@pytest.mark.parametrize("report", [False, True])
def test_with_secagg_the_strategy_decodes_the_one_aggregate(config, tmp_path, report):
    round_ = honest_round(config.replace(secagg=True, report_client_metrics=report), tmp_path / "run")
    replies = {c: round_.reply(c) for c in (0, 1)}
    start = shared_state(round_.strategy.server.network)
    delta = [np.full(v.shape, 1.5) for v in start.values()]
    scales = round_.strategy.scales.copy()
    # SecAgg+ hands every reply the same weighted mean of the encoded updates; here both clients sent `delta`.
    aggregate = encode_update(delta, scales, weight_ratio=1.0, clipping_range=8.0)
    if report:  # the metrics' weighted means travel as one more array of the sum
        aggregate.append(encode_metrics({"loss": 3.0, "target_entropy": 0.5}, clipping_range=8.0))
    round_.strategy.aggregate_fit(
        round_.server_round, [(Node(100 + c), with_arrays(replies[c], aggregate)) for c in (0, 1)], []
    )
    for key, moved in state_delta(shared_state(round_.strategy.server.network), start).items():
        assert torch.allclose(moved, torch.full_like(moved, 1.5), atol=1e-6), key
    assert np.array_equal(round_.strategy.scales, scales)  # nothing came near the clipping range
    (logged,) = round_.reports
    if report:
        assert logged.server_stats["loss"] == pytest.approx(3.0)
        assert logged.server_stats["target_entropy"] == pytest.approx(0.5)
        assert "rotation_loss" not in logged.server_stats  # no client reported it
    else:
        assert not {"loss", "target_entropy", "steps", "train_seconds"} & set(logged.server_stats)


def masked_vector(round_: HonestRound) -> list[np.ndarray]:
    """A masked vector of the form SecAgg+ sends (its values are random to the server anyway)."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, 2**32, size=shape, dtype=np.int64) for shape in round_.strategy.masked_vector_shapes()]


@pytest.mark.parametrize(("case", "tamper", "reason"), [c for c in HOSTILE_REPLIES if "delta" not in c[0]][::4])
def test_under_secagg_a_hostile_reply_is_kept_out_of_the_masked_sum(config, tmp_path, honest, case, tamper, reason):
    round_ = honest_round(config.replace(secagg=True), tmp_path / "run")
    size = round_.plan.client_sizes[1]
    masked = masked_vector(round_)
    assert round_.strategy.check_masked_reply(100, honest[0], masked) is None
    got = round_.strategy.check_masked_reply(101, tamper(honest[1], size), masked)
    assert got is not None and re.search(reason, got), got
    assert round_.strategy.check_masked_reply(101, None, masked) == "the reply is not a readable fit result"
    assert [r.client for r in round_.strategy._rejected] == [1, 1]


MASKED_VECTOR_TAMPERING = [
    ("an array missing", lambda v: v[:-1], "has .* arrays, not"),
    ("an array too many", lambda v: [*v, v[-1]], "has .* arrays, not"),
    ("a broadcastable shape", lambda v: [v[0], v[1][:1].reshape(-1)[:1], *v[2:]], r"masked array 1 is .*, not int64"),
    ("floats", lambda v: [v[0].astype(np.float64), *v[1:]], r"masked array 0 is float64"),
    ("uint64, which Flower's sum turns into floats", lambda v: [v[0].astype(np.uint64), *v[1:]], r"masked array 0 is uint64"),
    ("big-endian int64", lambda v: [v[0].astype(">i8"), *v[1:]], r"masked array 0 is >i8"),
    ("a value at the modulus", lambda v: [np.full_like(v[0], 2**32), *v[1:]], "outside"),
    ("a negative value", lambda v: [v[0], -np.abs(v[1]) - 1, *v[2:]], "outside"),
    ("unreadable", lambda v: None, "no readable masked vector"),
]


@pytest.mark.parametrize(("case", "tamper", "reason"), MASKED_VECTOR_TAMPERING)
def test_under_secagg_a_malformed_masked_vector_is_kept_out_of_the_sum(config, tmp_path, honest, case, tamper, reason):
    round_ = honest_round(config.replace(secagg=True), tmp_path / "run")
    got = round_.strategy.check_masked_reply(101, honest[1], tamper(masked_vector(round_)))
    assert got is not None and re.search(reason, got), got
    assert [r.client for r in round_.strategy._rejected] == [1]


def test_the_strategy_knows_each_travelling_tensors_shape_in_the_order_the_state_travels(fresh):
    state = fresh.strategy.server.global_state()
    assert fresh.strategy._shapes == [tuple(tensor.shape) for tensor in state.values()]


@pytest.mark.parametrize("report", [False, True])
def test_under_secagg_the_masked_vector_holds_a_metrics_array_only_when_the_run_reports_metrics(config, tmp_path, report):
    """The real client's vector has the form the strategy expects; one of the other setting's form is kept out."""
    round_ = honest_round(config.replace(secagg=True, report_client_metrics=report), tmp_path / "run")
    reply = round_.reply(1)
    sent = [(1,), *(a.shape for a in delta_of(reply))]  # Flower puts the weight factor first
    assert sent == round_.strategy.masked_vector_shapes()
    assert sent == [(1,), *secure_sum_shapes(round_.strategy._shapes, metrics=report)]
    assert round_.strategy.check_masked_reply(101, reply, [np.zeros(s, np.int64) for s in sent]) is None
    other = [np.zeros(s, np.int64) for s in [(1,), *secure_sum_shapes(round_.strategy._shapes, metrics=not report)]]
    assert "arrays, not" in round_.strategy.check_masked_reply(101, reply, other)


def test_in_round_0_a_reply_with_a_model_delta_is_rejected(config, tmp_path):
    round_ = honest_round(config, tmp_path / "run", train=False)
    good, other = round_.reply(0), round_.reply(1)
    assert delta_of(good) == []  # round 0 does not train
    with_delta = with_arrays(other, [np.zeros(3, np.float32)])
    round_.strategy.aggregate_fit(round_.server_round, [(Node(100), good), (Node(101), with_delta)], [])
    (report,) = round_.reports
    assert [(r.client, r.reason) for r in report.rejected] == [(1, "it sent a model delta in round 0, which does not train")]
    assert round_.strategy.server.initialised and round_.strategy.server.centroids is not None


@pytest.mark.parametrize("value", [np.inf, 7.5e5], ids=["weight total aimed at 0", "weight total aimed at 1"])
def test_an_aggregate_no_honest_round_can_produce_leaves_the_model_unchanged(config, tmp_path, value):
    """A client can shift the weight factor inside its masked vector; the sum then comes out infinite or huge."""
    round_ = honest_round(config.replace(secagg=True), tmp_path / "run")
    start = shared_state(round_.strategy.server.network)
    delta = [np.full(v.shape, 1.5) for v in start.values()]
    aggregate = encode_update(delta, round_.strategy.scales, weight_ratio=1.0, clipping_range=8.0)
    aggregate[0] = np.full_like(aggregate[0], value)
    round_.strategy.aggregate_fit(
        round_.server_round, [(Node(100 + c), with_arrays(round_.reply(c), aggregate)) for c in (0, 1)], []
    )
    for key, moved in state_delta(shared_state(round_.strategy.server.network), start).items():
        assert torch.count_nonzero(moved) == 0, key
    (report,) = round_.reports
    assert report.server_stats.get("secagg_halted") == 1.0 and len(report.releases) == 2  # releases still recorded
    assert round_.strategy.halted_rounds == 1


def test_when_one_tensor_overflows_no_part_of_the_update_is_applied_and_its_scale_grows(config, tmp_path):
    """A clipped BatchNorm variance left alone beside applied weights made the layer inconsistent; nothing moves now."""
    round_ = honest_round(config.replace(secagg=True), tmp_path / "run")
    start = shared_state(round_.strategy.server.network)
    keys = list(start)
    clipped = next(i for i, k in enumerate(keys) if k.endswith("running_var"))
    scales = round_.strategy.scales.copy()
    delta = [np.full(v.shape, 0.5) for v in start.values()]
    delta[clipped] = np.full(delta[clipped].shape, 9.0 * scales[clipped])  # beyond the clipping range 8 after scaling
    aggregate = encode_update(delta, scales, weight_ratio=1.0, clipping_range=8.0)
    aggregate[clipped] = np.clip(aggregate[clipped], -8.0, 8.0)  # SecAgg+ saturates; the indicator says so
    round_.strategy.aggregate_fit(
        round_.server_round, [(Node(100 + c), with_arrays(round_.reply(c), aggregate)) for c in (0, 1)], []
    )
    for key, moved in state_delta(shared_state(round_.strategy.server.network), start).items():
        assert torch.count_nonzero(moved) == 0, key
    grown = round_.strategy.scales / scales
    assert grown[clipped] == 4.0 and np.all(np.delete(grown, clipped) == 1.0)
    (report,) = round_.reports
    assert report.server_stats["secagg_rejected_tensors"] == 1.0 and len(report.releases) == 2
    assert round_.strategy.overflow_rounds == 1 and round_.strategy.secure_aggregation_summary()["overflow_rounds"] == 1
