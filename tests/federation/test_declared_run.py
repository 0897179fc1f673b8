"""The ClientApp's client computes from its declared run and holds the server to it: round keys, SecAgg+, budget.

Each test builds the client with the ClientApp's own ``client_fn`` and
hands it fit instructions from the real strategy, honest or with one thing
changed, as a deviating server would send them.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from flwr.common import FitIns, bytes_to_ndarray, ndarray_to_bytes

from privfed.federation.client import DeclaredRun, OrchestraClient
from privfed.federation.client_app import NodeGuardFailed
from privfed.models import OrchestraNetwork
from privfed.orchestra.model_state import shared_keys
from privfed.privacy.client_guard import ClientGuard, RoundRefused
from privfed.run.plan import plan_run
from tests.federation import honest_round
from tests.federation.honest_round import declared_client, decode_release

PARTITION = 1


def instructions(plan, *, secagg="declared", task="train") -> FitIns:
    """A fit instruction from the real strategy for the planned run."""
    return honest_round.instructions(plan.config, train=task == "train", secagg=secagg)


def client(plan, tmp_path) -> OrchestraClient:
    return declared_client(plan.config, PARTITION, tmp_path / "state")


def ledger(tmp_path):
    return tmp_path / "state" / f"privfed-ledger-partition-{PARTITION}.jsonl"


@pytest.fixture
def plan(tiny_config, tmp_path):
    return plan_run(tiny_config.replace(mechanism="ldp", epsilon=2.0, out=str(tmp_path / "run")))


def test_the_honest_servers_round_is_answered_with_the_clients_own_calibration_and_charged(plan, tmp_path):
    own = client(plan, tmp_path)
    res = own.fit(instructions(plan))
    assert res.num_examples > 0
    assert decode_release(res.metrics).events == own.declared.guard.budget.release_events
    assert [json.loads(line)["round"] for line in ledger(tmp_path).read_text().splitlines()] == [1]


@pytest.mark.parametrize(
    "key, value",
    [
        # what the server used to send: its calibration, weakened here, and the client configuration
        ("mechanism_params", json.dumps({"sum_noise_multiplier": 1e-6})),
        ("client_config", json.dumps({"local": {"epochs": 50}, "split": {"alpha": 100.0}})),
        ("dp_sgd", json.dumps({"noise_multiplier": 1e-6, "max_grad_norm": 100.0})),
        # a server that picks the seed would pick a round's augmentations, memory and release draws
        ("seed", 12345),
        ("report_client_metrics", True),
    ],
)
def test_any_key_but_the_rounds_values_is_refused_before_anything_is_charged(plan, tmp_path, key, value):
    ins = instructions(plan)
    with pytest.raises(RoundRefused, match=f"unexpected key '{key}'"):
        client(plan, tmp_path).fit(FitIns(ins.parameters, {**ins.config, key: value}))
    assert not ledger(tmp_path).exists()


def test_secagg_values_are_refused_in_a_run_that_declared_no_secagg(plan, tmp_path):
    plain = dataclasses.replace(plan, config=plan.config.replace(secagg=False))
    sent = instructions(plan)  # the server runs SecAgg+ anyway
    with pytest.raises(RoundRefused, match="unexpected key 'secagg_"):
        client(plain, tmp_path).fit(sent)


def test_secagg_values_are_refused_in_an_init_round_which_sums_nothing(plan, tmp_path):
    train = instructions(plan)
    init = instructions(plan, task="init")
    assert "secagg_scales" not in init.config  # the honest server sends none
    with pytest.raises(RoundRefused, match="unexpected key 'secagg_"):
        client(plan, tmp_path).fit(FitIns(init.parameters, {**init.config, "secagg_scales": train.config["secagg_scales"]}))
    assert not ledger(tmp_path).exists()


def test_a_task_other_than_init_or_train_is_refused(plan, tmp_path):
    ins = instructions(plan)
    with pytest.raises(RoundRefused, match="the task is"):
        client(plan, tmp_path).fit(FitIns(ins.parameters, {**ins.config, "task": "release"}))


def test_own_parameters_the_sampler_cannot_draw_are_refused_before_anything_is_charged(plan, tmp_path):
    own = client(plan, tmp_path)
    budget = own.declared.guard.budget
    undrawable = dataclasses.replace(budget, params={**budget.params, "tree_count_parameter": 1e-9})
    declared = dataclasses.replace(own.declared, guard=ClientGuard(undrawable, ledger(tmp_path)))
    with pytest.raises(RoundRefused, match="do not build the mechanism"):
        OrchestraClient(PARTITION, declared).fit(instructions(plan))
    assert not ledger(tmp_path).exists()


@pytest.mark.parametrize("report", [False, True])
def test_the_client_sends_training_metrics_as_its_declared_run_says(plan, tmp_path, report):
    plan = dataclasses.replace(plan, config=plan.config.replace(report_client_metrics=report))
    res = client(plan, tmp_path).fit(instructions(plan))
    arrays = len(res.parameters.tensors) - len(shared_keys(OrchestraNetwork(plan.config.backbone, plan.config.projection_dim)))
    assert arrays == (3 if report else 2)  # under SecAgg+ the metrics are one more array of the masked sum


@pytest.mark.parametrize("field", ["max_weight", "modulus_range"])
def test_a_secagg_encoding_other_than_the_declared_one_is_refused(plan, tmp_path, field):
    """A larger modulus would overflow the client's int64 masking after it trained and was charged."""
    doubled = dataclasses.replace(plan.secagg, **{field: 2 * getattr(plan.secagg, field)})
    with pytest.raises(RoundRefused, match="SecAgg\\+ encoding"):
        client(plan, tmp_path).fit(instructions(plan, secagg=doubled))
    assert not ledger(tmp_path).exists()


def test_a_training_round_without_secagg_is_refused_when_the_run_declared_it(plan, tmp_path):
    with pytest.raises(RoundRefused, match="declared SecAgg"):
        client(plan, tmp_path).fit(instructions(plan, secagg=None))


def test_the_same_round_is_not_answered_twice(plan, tmp_path):
    """Two answers to one round would let the server difference two SecAgg+ sums that differ by this client: asked
    again, the client sends its first answer again (tests/federation/test_reply_replay.py), and refuses a round
    before its last."""
    first = client(plan, tmp_path).fit(instructions(plan))
    again = client(plan, tmp_path).fit(instructions(plan))  # a fresh process, as Flower starts one per message
    assert again.parameters.tensors == first.parameters.tensors and again.metrics == first.metrics
    with pytest.raises(RoundRefused, match="round 0 of run 1 comes after round 1"):
        client(plan, tmp_path).fit(instructions(plan, task="init"))


@pytest.mark.parametrize("scale", [1e-308, float("nan"), float("inf")])
def test_secagg_scales_that_could_turn_an_update_into_inf_are_refused(plan, tmp_path, scale):
    """A tiny scale would make a finite update Inf, and the client's failure would tell the server it passed a
    threshold the server chose."""
    ins = instructions(plan)
    scales = bytes_to_ndarray(ins.config["secagg_scales"]).copy()
    scales[0] = scale
    ins.config["secagg_scales"] = ndarray_to_bytes(np.asarray(scales))
    with pytest.raises(RoundRefused, match="scales"):
        client(plan, tmp_path).fit(ins)


def test_a_node_whose_ledger_is_unreadable_says_nothing_about_it_to_the_server(plan, tmp_path):
    folder = tmp_path / "state"
    folder.mkdir()
    ledger(tmp_path).write_text('{"client": 0, "rou')
    with pytest.raises(NodeGuardFailed) as failure:
        client(plan, tmp_path)
    assert "state" not in str(failure.value) and "line" not in str(failure.value)


def test_a_declared_run_is_built_once_for_the_partition(plan):
    declared = DeclaredRun.of(plan.config, PARTITION, key=7)
    assert declared.run == 7 and declared.secagg == plan.secagg
    assert declared.guard.budget.params == plan.privacy.params  # the client's calibration is the server's plan


SECAGG_ENCODING = ("secagg_max_weight", "secagg_clipping_range", "secagg_quantization_range", "secagg_modulus_range")


def test_the_fit_message_carries_only_the_rounds_values(tiny_config):
    """The client reads its options from its declared run; the server sends no option at all."""
    config = tiny_config.replace(mechanism="ldp", epsilon=1.0, rounds=7, out="/somewhere/secret", knn_k=17)
    assert set(honest_round.instructions(config, train=False).config) == {"task", "round"}
    assert set(honest_round.instructions(config).config) == {"task", "round", "centroids", "secagg_scales", *SECAGG_ENCODING}
    assert set(honest_round.instructions(config.replace(secagg=False)).config) == {"task", "round", "centroids"}


def test_the_declared_run_gives_the_clients_split_and_local_training(tiny_config):
    config = tiny_config.replace(num_clients=3, alpha=0.5, seed=4, memory_size=64, device="cpu")
    declared = DeclaredRun.of(config, 0, key=0)
    assert (declared.split.dataset, declared.split.num_clients, declared.split.alpha, declared.split.seed) == (
        "shapes:300", 3, 0.5, 4,
    )
    assert declared.local.memory_size == 64 and declared.local.dp_sgd is None  # DP-SGD's settings are the guard's
    assert DeclaredRun.of(config.replace(method="rotpred", mechanism="reps"), 0, key=0).guard.budget.mechanism is None


def test_a_client_app_given_no_declared_run_reads_the_run_config_flower_hands_the_node(tiny_config):
    """The `flwr run` path: the declared run is the submitted run config (dashes, "" for unset)."""
    from flwr.app import Context, RecordDict

    from privfed.federation.client_app import make_client_fn

    run_config = {k.replace("_", "-"): "" if v is None else v for k, v in tiny_config.replace(seed=9).to_dict().items()}
    node = {"partition-id": 0, "num-partitions": tiny_config.num_clients}
    built = make_client_fn()(Context(run_id=1, node_id=1, node_config=node, state=RecordDict(), run_config=run_config))
    assert built.declared.config.seed == 9 and built.declared.split == DeclaredRun.of(tiny_config.replace(seed=9), 0, key=1).split


@pytest.mark.parametrize("partition, of", [(0, 3), (4, 4), (-1, 4)])
def test_a_node_whose_partition_is_not_one_of_the_runs_clients_is_refused_before_it_builds_anything(tiny_config, partition, of):
    from flwr.app import Context, RecordDict

    from privfed.errors import PrivfedError
    from privfed.federation.client_app import make_client_fn

    assert tiny_config.num_clients == 4
    node = {"partition-id": partition, "num-partitions": of}
    with pytest.raises(PrivfedError, match="one SuperNode per client"):
        make_client_fn(declared=tiny_config)(Context(run_id=1, node_id=1, node_config=node, state=RecordDict(), run_config={}))


def test_a_new_state_folder_is_on_disk_under_its_name_before_the_node_charges_into_it(tiny_config, tmp_path, synced):
    """The ledger file's name is flushed into its folder; a new folder's own name must be too, or a crash takes the
    whole ledger, and the node's budget starts again."""
    state = tmp_path / "var" / "privfed"
    declared_client(tiny_config, PARTITION, state)
    assert {str(tmp_path), str(tmp_path / "var")} <= {path for path, folder in synced if folder}
