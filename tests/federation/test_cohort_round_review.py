"""Review: a round's clients trained together on the local runtime, against deviating servers, failures and kills.

The local runtime answers a round's training messages in two passes when
clients train together (:mod:`privfed.federation.cohort_round`). Every
attempt here is a real run or a real :class:`LocalGrid` with the real
ClientApp; "a deviating server" is an outer mod (it changes what one node
receives, as a server would) or messages pushed straight to the grid. A
"kill" is a BaseException an outer mod raises as a delivery arrives: like
SIGKILL it passes every ``except Exception`` and ends the run where it is;
nothing is written after it (a resume point is written only after a round).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator

import flwr.compat.common.recorddict_compat as compat
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Message
from flwr.app.message_type import MessageType
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays

from privfed.config import build_config
from privfed.federation.client_app import FIT_CONFIG_RECORD, make_client_app
from privfed.federation.local_runtime import SIMULATED_RUN_KEY, LocalGrid, cohort_of, superlink_identity
from privfed.federation.messages import tensor_to_bytes
from privfed.federation.reply_store import ReplyStore, reply_file
from privfed.federation.simulation import simulate
from privfed.run.plan import plan_resume, plan_run
from privfed.secagg.masking import SHARE_KEY
from tests.federation import honest_round
from tests.run_records import jsonl, same


def _train_message(msg: Message) -> tuple[dict, bool]:
    fit = msg.content.config_records.get(FIT_CONFIG_RECORD)
    return fit, msg.metadata.message_type == MessageType.TRAIN and fit is not None and fit.get("task") == "train"


def _ledger_rounds(folder, partition: int) -> list[int]:
    path = folder / f"privfed-ledger-partition-{partition}.jsonl"
    return [json.loads(line)["round"] for line in path.read_text().splitlines()] if path.exists() else []


# ---------------------------------------------------------------------------------------------------------------
# A kill in the second pass, then a resume.


class Killed(BaseException):
    """What SIGKILL does to the run: nothing after it runs."""


def kill_in_the_last_pass(round_index: int, at: int, passes: int):
    """Outer mod: "kills" the run as the ``at``-th client's last delivery of ``round_index`` arrives (before it answers).

    ``passes``: how many times the runtime delivers each training message (2 when clients train together).
    """
    seen: Counter = Counter()
    last = [0]

    def mod(msg, context, call_next):
        fit, trains = _train_message(msg)
        if trains and int(fit["round"]) == round_index:
            key = int(context.node_config["partition-id"])
            seen[key] += 1
            if seen[key] == passes:
                last[0] += 1
                if last[0] == at:
                    raise Killed
        return call_next(msg, context)

    return mod


#: Two threads per client keep every client in this process (no forked workers), where the mods here see and stop it.
IN_PROCESS = 2


def _kill_config(out, clients_per_step: int, **changes):
    settings = dict(
        dataset="shapes:300", num_clients=4, participation=0.75, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=2, seed=5, device="cpu",
        mechanism="kanon", clients_per_step=clients_per_step, client_cpus=IN_PROCESS, out=str(out),
    )
    return build_config(**{**settings, **changes})


def _killed_then_resumed(out, clients_per_step: int, *, at: int = 2, **changes):
    """The run killed as the ``at``-th client's last delivery of round 2 arrives, then resumed from round 1."""
    plan = plan_run(_kill_config(out, clients_per_step, **changes))
    with pytest.raises(Killed):
        simulate(plan, outer_mods=[kill_in_the_last_pass(2, at, 2 if clients_per_step > 1 else 1)])
    stored = [ReplyStore(reply_file(plan.run_dir.client_ledgers, p)).get(SIMULATED_RUN_KEY, 2) for p in range(4)]
    assert sum(s is not None and s.reply is not None for s in stored) == at - 1  # answered before the kill
    resumed_plan, point = plan_resume(plan.run_dir.path, {})
    assert point.round == 1
    simulate(resumed_plan, resume=point)
    return plan.run_dir.path


def _assert_same_run(whole, run) -> None:
    for partition in range(4):
        assert _ledger_rounds(whole / "client-ledgers", partition) == _ledger_rounds(run / "client-ledgers", partition)
    assert jsonl(whole / "ledger.jsonl") == jsonl(run / "ledger.jsonl")
    comparable = [{k: v for k, v in m.items() if not k.endswith("seconds")} for m in jsonl(whole / "metrics.jsonl")]
    resumed = [{k: v for k, v in m.items() if not k.endswith("seconds")} for m in jsonl(run / "metrics.jsonl")]
    assert same(comparable, resumed)
    final_a = torch.load(whole / "checkpoints" / "final.pt", weights_only=True)
    final_b = torch.load(run / "checkpoints" / "final.pt", weights_only=True)
    for key, value in final_a["network"].items():
        assert torch.allclose(value.double(), final_b["network"][key].double(), atol=1e-5), key
    assert torch.allclose(final_a["centroids"], final_b["centroids"], atol=1e-5)


@pytest.mark.parametrize(
    ("clients_per_step", "at"),
    [
        (1, 2),
        (3, 1),  # every client charged and begun, none answered: what a kill during the cohort's training leaves
        pytest.param(3, 2, marks=pytest.mark.slow),  # a replayed SecAgg+ round: the first pass works on a copy of the node's context
    ],
)
def test_after_a_kill_in_the_last_pass_every_sampled_client_completes_the_replayed_round(tmp_path, clients_per_step, at):
    run = _killed_then_resumed(tmp_path / "run", clients_per_step, at=at)
    replayed = next(m for m in jsonl(run / "metrics.jsonl") if m["round"] == 2)
    assert (replayed["clients_completed"], replayed["client_failures"]) == (3, 0)
    for partition in range(4):  # charged once, whatever happened
        rounds = _ledger_rounds(run / "client-ledgers", partition)
        assert len(rounds) == len(set(rounds))


@pytest.mark.slow
def test_a_kill_after_the_first_pass_resumes_to_the_uninterrupted_run_under_secagg(tmp_path):
    """Every sampled client charged and begun, none answered: the resumed round trains the same cohort again."""
    whole = tmp_path / "whole"
    simulate(plan_run(_kill_config(whole, 3)))
    _assert_same_run(whole, _killed_then_resumed(tmp_path / "run", 3, at=1))


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="review: without SecAgg+ the replay works, but the clients left unanswered by the kill train again in a "
    "smaller cohort; in float32 that is another computation (rounding, amplified by training), so the resumed run "
    "ends elsewhere than the uninterrupted one",
)
def test_without_secagg_a_kill_in_the_second_pass_resumes_to_the_uninterrupted_run(tmp_path):
    whole = tmp_path / "whole"
    simulate(plan_run(_kill_config(whole, 3, secagg=False)))
    run = _killed_then_resumed(tmp_path / "run", 3, secagg=False)
    replayed = next(m for m in jsonl(run / "metrics.jsonl") if m["round"] == 2)
    assert (replayed["clients_completed"], replayed["client_failures"]) == (3, 0)  # the replay itself works
    _assert_same_run(whole, run)  # the final model differs by about 4e-3 here


# ---------------------------------------------------------------------------------------------------------------
# A deviating server talking to the grid: messages pushed twice, overlapping pushes, other instructions.

RUN = 11


def _grid(tmp_path, **changes):
    """A LocalGrid whose four nodes train together, the real ClientApp, ldp releases (OS noise: a second
    computation of a round could not send the same release)."""
    settings = dict(mechanism="ldp", epsilon=2.0, participation=1.0, clients_per_step=4, out=str(tmp_path / "run"))
    config = plan_run(honest_round.small_round_config(**{**settings, **changes})).config
    state = tmp_path / "state"
    app = make_client_app(declared=config, state_dir=state, run_key=RUN)
    grid = LocalGrid(app, config.num_clients, cohort=cohort_of(config))
    assert cohort_of(config) is not None
    return config, grid, state


def _message(ins: FitIns, node: int) -> tuple[FitIns, int]:
    return ins, node


def _exchange(grid: LocalGrid, pushes: list[list[tuple[FitIns, int]]]) -> list[Message]:
    """Pushes each list of (instructions, node) in turn (each push trains its clients together), then pulls every
    reply in push order."""
    with superlink_identity(grid.run.run_id):
        ids = [
            list(grid.push_messages([
                Message(compat.fitins_to_recorddict(ins, keep_input=True), node, MessageType.TRAIN) for ins, node in messages
            ]))
            for messages in pushes
        ]
        replies = []
        for batch in ids:
            for message_id in batch:
                replies.extend(grid.pull_messages([message_id]))
    return replies


def _answer(reply: Message):
    assert not reply.has_error(), reply.error
    return compat.recorddict_to_fitres(reply.content, keep_input=True)


def _together(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "trained together" in r.getMessage()]


def test_a_train_message_pushed_twice_in_one_push_is_trained_charged_and_released_once(tmp_path, caplog):
    config, grid, state = _grid(tmp_path)
    ins = honest_round.instructions(config, secagg=None)
    nodes = list(grid.get_node_ids())
    with caplog.at_level(logging.INFO, logger="privfed.federation.cohort_round"):
        replies = _exchange(grid, [[_message(ins, nodes[0]), _message(ins, nodes[0]), _message(ins, nodes[1])]])
    first, again, other = (_answer(r) for r in replies)
    assert again.metrics == first.metrics and "release_vectors" in first.metrics  # the same release, not a second
    assert again.parameters.tensors == first.parameters.tensors
    assert other.metrics["release_vectors"] != first.metrics["release_vectors"]
    assert _together(caplog) == ["round 1: partitions [0, 1] trained together"]
    assert _ledger_rounds(state, 0) == [1] and _ledger_rounds(state, 1) == [1]


def test_overlapping_pushes_for_one_round_charge_and_release_each_client_once(tmp_path, caplog):
    """A second push for the same round before the first one's replies are pulled replaces the grid's cohort."""
    config, grid, state = _grid(tmp_path)
    ins = honest_round.instructions(config, secagg=None)
    nodes = list(grid.get_node_ids())
    with caplog.at_level(logging.INFO, logger="privfed.federation.cohort_round"):
        replies = _exchange(grid, [[_message(ins, nodes[0]), _message(ins, nodes[1])], [_message(ins, nodes[0]), _message(ins, nodes[2])]])
    a, b, a_again, c = (_answer(r) for r in replies)
    assert a_again.metrics == a.metrics and a_again.parameters.tensors == a.parameters.tensors
    assert len({r.metrics["release_vectors"] for r in (a, b, c)}) == 3
    assert [r.metrics["client_id"] for r in (a, b, a_again, c)] == [0, 1, 0, 2]
    for partition in (0, 1, 2):
        assert _ledger_rounds(state, partition) == [1]
    assert _together(caplog) == ["round 1: partitions [0, 1] trained together", "round 1: partitions [0, 2] trained together"]


@pytest.mark.parametrize("order", ["honest first", "other first"])
def test_other_instructions_for_a_node_in_the_same_push_are_refused_and_charged_nothing(tmp_path, caplog, order):
    config, grid, state = _grid(tmp_path)
    ins = honest_round.instructions(config, secagg=None)
    other = F.normalize(torch.randn(config.num_global_centroids, config.projection_dim), dim=1)
    deviating = FitIns(ins.parameters, {**ins.config, "centroids": tensor_to_bytes(other)})
    nodes = list(grid.get_node_ids())
    to_zero = [_message(ins, nodes[0]), _message(deviating, nodes[0])]
    if order == "other first":
        to_zero.reverse()
    with caplog.at_level(logging.INFO, logger="privfed.federation.cohort_round"):
        replies = _exchange(grid, [[*to_zero, _message(ins, nodes[1])]])
    assert [r.has_error() for r in replies[:2]] == [False, True]  # the first instructions it saw are the round's
    _answer(replies[2])
    assert _ledger_rounds(state, 0) == [1]
    # The refused instructions never joined a cohort; the admitted ones are grouped by their digest.
    expected = [[0, 1]] if order == "honest first" else [[0], [1]]
    assert _together(caplog) == [f"round 1: partitions {group} trained together" for group in expected]


@pytest.mark.parametrize("mechanism", ["kanon", "ldp"])
def test_a_client_whose_round_fails_after_its_admission_fails_once_and_is_charged_once(tmp_path, caplog, mechanism):
    """Centroids of the wrong width for node 0, charged in the first pass: its cohort (its own digest) fails, node 0
    trains alone in the second pass and fails there; the others train together, and asking node 0 again gets the
    failure for no charge."""
    config, grid, state = _grid(tmp_path, mechanism=mechanism, epsilon=2.0 if mechanism == "ldp" else None)
    ins = honest_round.instructions(config, secagg=None)
    wrong = F.normalize(torch.randn(config.num_global_centroids, config.projection_dim + 1), dim=1)
    broken = FitIns(ins.parameters, {**ins.config, "centroids": tensor_to_bytes(wrong)})
    nodes = list(grid.get_node_ids())
    with caplog.at_level(logging.INFO, logger="privfed.federation.cohort_round"):
        replies = _exchange(grid, [[_message(broken, nodes[0]), _message(ins, nodes[1]), _message(ins, nodes[2])]])
    assert replies[0].has_error() and "ClientRoundFailed" in replies[0].error.reason
    assert [_answer(r).metrics["client_id"] for r in replies[1:]] == [1, 2]
    assert any("1 clients could not train together" in r.getMessage() for r in caplog.records)
    assert _together(caplog) == ["round 1: partitions [1, 2] trained together"]
    assert ReplyStore(reply_file(state, 0)).get(RUN, 1).failed
    again = _exchange(grid, [[_message(broken, nodes[0]), _message(ins, nodes[3])]])
    assert again[0].has_error() and "ClientRoundFailed" in again[0].error.reason
    assert _ledger_rounds(state, 0) == [1] and _ledger_rounds(state, 3) == [1]


# ---------------------------------------------------------------------------------------------------------------
# A server that sends one node another model or other centroids, in a real run (float64: a cohort equals alone).

TAMPERED = 0


def _tamper(what: str):
    """Outer mod: node TAMPERED gets a model scaled by 1.05 (``model``) or centroids of its own (``centroids``)."""

    def mod(msg, context, call_next):
        _fit, trains = _train_message(msg)
        if trains and int(context.node_config["partition-id"]) == TAMPERED:
            ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
            if what == "model":
                arrays = [a * 1.05 if np.issubdtype(a.dtype, np.floating) else a for a in parameters_to_ndarrays(ins.parameters)]
                ins = FitIns(ndarrays_to_parameters(arrays), ins.config)
            else:
                own = F.normalize(torch.randn(8, 16, generator=torch.Generator().manual_seed(9), dtype=torch.float64), dim=1)
                ins = FitIns(ins.parameters, {**ins.config, "centroids": tensor_to_bytes(own)})
            tampered = compat.fitins_to_recorddict(ins, keep_input=True)
            for name, record in tampered.array_records.items():
                msg.content.array_records[name] = record
            for name, record in tampered.config_records.items():
                msg.content.config_records[name] = record
        return call_next(msg, context)

    return mod


@pytest.fixture
def float64() -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _plaintext_replies(out, clients_per_step: int, outer) -> dict[int, list[np.ndarray]]:
    """Each client's round-1 delta as it left the client (an inner mod), in a float64 run (whose replies the server
    then rejects as not float32: only what the clients computed matters here)."""
    replies: dict[int, list[np.ndarray]] = {}

    def capture(msg, context, call_next):
        reply = call_next(msg, context)
        _fit, trains = _train_message(msg)
        if trains and not reply.has_error():
            res = compat.recorddict_to_fitres(reply.content, keep_input=True)
            replies[int(context.node_config["partition-id"])] = parameters_to_ndarrays(res.parameters)
        return reply

    config = build_config(
        dataset="shapes:150", num_clients=3, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=1, secagg=False, device="cpu",
        mechanism="kanon", clients_per_step=clients_per_step, client_cpus=IN_PROCESS, out=str(out),
    )
    simulate(plan_run(config), outer_mods=[outer], inner_mods=[capture])
    return replies


@pytest.mark.parametrize("what", ["model", pytest.param("centroids", marks=pytest.mark.slow)])
def test_a_node_sent_other_instructions_trains_apart_on_what_it_was_sent(tmp_path, caplog, float64, what):
    with caplog.at_level(logging.INFO, logger="privfed.federation.cohort_round"):
        together = _plaintext_replies(tmp_path / "together", 3, _tamper(what))
    assert _together(caplog) == ["round 1: partitions [0] trained together", "round 1: partitions [1, 2] trained together"]
    alone = _plaintext_replies(tmp_path / "alone", 1, _tamper(what))
    assert sorted(together) == sorted(alone) == [0, 1, 2]
    for partition in range(3):
        assert all(a.dtype == np.float64 for a in alone[partition])
        difference = max(float(np.abs(x - y).max()) for x, y in zip(together[partition], alone[partition]))
        assert difference <= 1e-9, (partition, difference)


# ---------------------------------------------------------------------------------------------------------------
# Under SecAgg+: ddp-sums shares, and training metrics in the masked sum.


@pytest.mark.slow
def test_ddp_sums_each_client_shares_once_per_round_into_the_secure_sum_when_trained_together(tmp_path, caplog):
    shares: Counter = Counter()
    leaked: list = []

    def inner(msg, context, call_next):  # the plaintext reply, before SecAgg+ masks it and takes the share out
        reply = call_next(msg, context)
        fit, trains = _train_message(msg)
        if trains and not reply.has_error() and SHARE_KEY in reply.content.config_records["fitres.metrics"]:
            shares[(int(context.node_config["partition-id"]), int(fit["round"]))] += 1
        return reply

    def outer(msg, context, call_next):  # what the server receives
        reply = call_next(msg, context)
        if not reply.has_error():
            leaked.extend(name for record in reply.content.config_records.values() for name in record if name == SHARE_KEY)
        return reply

    config = build_config(
        dataset="shapes:300", num_clients=4, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=2, seed=1, device="cpu",
        mechanism="ddp-sums", epsilon=10.0, clients_per_step=4, out=str(tmp_path / "run"),
    )
    plan = plan_run(config)
    with caplog.at_level(logging.INFO, logger="privfed.federation.cohort_round"):
        simulate(plan, outer_mods=[outer], inner_mods=[inner])
    assert _together(caplog) == [f"round {r}: partitions [0, 1, 2, 3] trained together" for r in (1, 2)]
    assert shares == {(p, r): 1 for p in range(4) for r in (1, 2)}  # one share each, none computed in the first pass
    assert not leaked
    metrics = jsonl(plan.run_dir.path / "metrics.jsonl")
    assert [m["clients_completed"] for m in metrics] == [4, 4, 4]
    assert all(m["clients"] == 4 and m["moved_centroid_fraction"] > 0 for m in metrics[1:])  # every share, once
    server = [(e["round"], e["client"]) for e in jsonl(plan.run_dir.path / "ledger.jsonl") if e["kind"] == "release"]
    assert sorted(server) == [(r, c) for r in (1, 2) for c in range(4)]
    for partition in range(4):
        assert _ledger_rounds(plan.run_dir.client_ledgers, partition) == [1, 2]


@pytest.mark.slow
def test_training_metrics_in_the_masked_sum_are_those_each_client_computes_alone(tmp_path, float64):
    """report_client_metrics under SecAgg+: the metrics join the masked sum; in float64 a cohort's equal alone's."""
    from privfed.secagg.encoding import SECURE_METRIC_SCALES

    def run(out, clients_per_step: int) -> dict[int, np.ndarray]:
        encoded: dict[int, np.ndarray] = {}

        def inner(msg, context, call_next):
            reply = call_next(msg, context)
            _fit, trains = _train_message(msg)
            if trains and not reply.has_error():
                arrays = parameters_to_ndarrays(compat.recorddict_to_fitres(reply.content, keep_input=True).parameters)
                encoded[int(context.node_config["partition-id"])] = arrays[-1]
            return reply

        config = build_config(
            dataset="shapes:150", num_clients=3, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
            memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=1, device="cpu", mechanism="kanon",
            report_client_metrics=True, clients_per_step=clients_per_step, client_cpus=IN_PROCESS, out=str(out),
        )
        simulate(plan_run(config), inner_mods=[inner])
        return encoded

    together, alone = run(tmp_path / "together", 3), run(tmp_path / "alone", 1)
    assert sorted(together) == sorted(alone) == [0, 1, 2]
    names = list(SECURE_METRIC_SCALES)
    computed = [i for i, name in enumerate(names) if not name.endswith("_seconds")]  # timings are the clock's
    assert len(computed) == 6
    for partition in range(3):
        assert together[partition].shape == (2 * len(names),)
        values, present = together[partition][0::2], together[partition][1::2]
        assert present.sum() == len(names)  # every metric reported
        assert np.abs(values[computed] - alone[partition][0::2][computed]).max() <= 1e-9, partition


def _round_one(out, clients_per_step: int) -> dict:
    config = build_config(
        dataset="shapes:300", num_clients=3, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=1, device="cpu", mechanism="kanon",
        secagg=False, report_client_metrics=True, clients_per_step=clients_per_step, client_cpus=IN_PROCESS, out=str(out),
    )
    simulate(plan_run(config))
    return next(m for m in jsonl(out / "metrics.jsonl") if m["round"] == 1)


@pytest.mark.parametrize(
    "clients_per_step",
    [
        1,
        3,
    ],
)
def test_the_clients_training_time_fits_in_the_round(tmp_path, clients_per_step):
    record = _round_one(tmp_path / "run", clients_per_step)
    assert record["clients_completed"] == 3
    assert record["clients_completed"] * record["train_seconds"] <= record["round_seconds"]


def _final_model(out, clients_per_step: int, threads: int) -> dict:
    config = build_config(
        dataset="shapes:300", num_clients=3, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=1, device="cpu", mechanism="kanon",
        client_cpus=1.0, clients_per_step=clients_per_step, out=str(out),
    )
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # the caller's (e.g. the machine's cores for `privfed train`)
    try:
        simulate(plan_run(config))
    finally:
        torch.set_num_threads(before)
    return torch.load(out / "checkpoints" / "final.pt", weights_only=True)["network"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "clients_per_step",
    [
        1,
        3,
    ],
)
def test_the_same_seed_gives_the_same_model_whatever_threads_the_caller_runs(tmp_path, clients_per_step):
    one, two = (_final_model(tmp_path / f"threads-{n}", clients_per_step, n) for n in (1, 2))
    for key, value in one.items():
        assert torch.equal(value, two[key]), key
