"""The ClientApp's client holds the server to the declared run: configuration, SecAgg+ encoding, budget.

Each test builds the client with the ClientApp's own ``client_fn`` and
hands it fit instructions from the real strategy, honest or with one thing
changed, as a deviating server would send them.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from flwr.app import Context, RecordDict
from flwr.common import ndarrays_to_parameters

from privfed.federation.client_app import make_client_fn
from privfed.federation.client_config import ClientConfig
from privfed.federation.strategy import OrchestraStrategy
from privfed.models import OrchestraNetwork
from privfed.orchestra.model_state import shared_keys
from privfed.orchestra.server import OrchestraServer
from privfed.privacy.client_guard import RoundRefused
from privfed.run.plan import plan_run

PARTITION = 1


def instructions(plan, *, client_config=None, secagg="planned", params=None, task="train"):
    """A fit instruction from the real strategy, for the planned run unless told otherwise."""
    config = plan.config
    torch.manual_seed(0)
    network = OrchestraNetwork(config.backbone, config.projection_dim)
    server = OrchestraServer(network, num_global_centroids=config.num_global_centroids, seed=0)
    if task == "train":
        server.initialised = True
        server.centroids = F.normalize(torch.randn(config.num_global_centroids, config.projection_dim), dim=1)
    strategy = OrchestraStrategy(
        server, client_config or ClientConfig.of(config), on_round_end=lambda report: None,
        clients_per_round=config.clients_per_round, seed=config.seed,
        mechanism_params=plan.privacy.params if params is None else params,
        secagg=plan.secagg if secagg == "planned" else secagg,
    )
    state = ndarrays_to_parameters([server.global_state()[k].numpy() for k in shared_keys(network)])
    return strategy.fit_instructions(server_round=2 if task == "train" else 1, parameters=state)


def client(plan, tmp_path):
    node = {"partition-id": PARTITION, "num-partitions": plan.config.num_clients}
    context = Context(run_id=1, node_id=1, node_config=node, state=RecordDict(), run_config={})
    return make_client_fn(plan.config, tmp_path / "state")(context)


@pytest.fixture
def plan(tiny_config, tmp_path):
    return plan_run(tiny_config.replace(mechanism="ldp", epsilon=2.0, out=str(tmp_path / "run")))


def test_the_honest_servers_round_is_answered_and_charged(plan, tmp_path):
    res = client(plan, tmp_path).fit(instructions(plan))
    assert res.num_examples > 0
    ledger = (tmp_path / "state" / f"privfed-ledger-partition-{PARTITION}.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in ledger] == [1]


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda c: dataclasses.replace(c, mechanism="reps"), "mechanism"),
        (lambda c: dataclasses.replace(c, local=dataclasses.replace(c.local, epochs=c.local.epochs + 5)), "local"),
        (lambda c: dataclasses.replace(c, split=dataclasses.replace(c.split, alpha=100.0)), "split"),
        # a server that turns metrics on behind the client's back: the declared run's value holds
        (lambda c: dataclasses.replace(c, report_client_metrics=True), "report_client_metrics"),
        # a server that picks the seed would pick a round's augmentations, memory and release draws
        (lambda c: dataclasses.replace(c, seed=c.seed + 1), "seed"),
    ],
)
def test_a_client_configuration_other_than_the_declared_one_is_refused(plan, tmp_path, change, named):
    tampered = change(ClientConfig.of(plan.config))
    with pytest.raises(RoundRefused, match=f"differs from the declared run in .*{named}"):
        client(plan, tmp_path).fit(instructions(plan, client_config=tampered))
    assert not (tmp_path / "state" / f"privfed-ledger-partition-{PARTITION}.jsonl").exists()


@pytest.mark.parametrize("report", [False, True])
def test_the_client_sends_training_metrics_as_its_declared_run_says(plan, tmp_path, report):
    plan = dataclasses.replace(plan, config=plan.config.replace(report_client_metrics=report))
    res = client(plan, tmp_path).fit(instructions(plan))
    arrays = len(res.parameters.tensors) - len(shared_keys(OrchestraNetwork(plan.config.backbone, plan.config.projection_dim)))
    assert arrays == (3 if report else 2)  # under SecAgg+ the metrics are one more array of the masked sum


@pytest.mark.parametrize("factor", [1 / 100, 2.0])
def test_weakened_or_noisier_noise_is_refused_with_a_clear_error(plan, tmp_path, factor):
    params = {**plan.privacy.params, "sum_noise_multiplier": plan.privacy.params["sum_noise_multiplier"] * factor}
    with pytest.raises(RoundRefused, match=r"sum_noise_multiplier .* is not the declared"):
        client(plan, tmp_path).fit(instructions(plan, params=params))
    assert not (tmp_path / "state" / f"privfed-ledger-partition-{PARTITION}.jsonl").exists()


@pytest.mark.parametrize("field", ["max_weight", "modulus_range"])
def test_a_secagg_encoding_other_than_the_declared_one_is_refused(plan, tmp_path, field):
    """A larger modulus would overflow the client's int64 masking after it trained and was charged."""
    doubled = dataclasses.replace(plan.secagg, **{field: 2 * getattr(plan.secagg, field)})
    with pytest.raises(RoundRefused, match="SecAgg\\+ encoding"):
        client(plan, tmp_path).fit(instructions(plan, secagg=doubled))
    assert not (tmp_path / "state" / f"privfed-ledger-partition-{PARTITION}.jsonl").exists()


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
    import numpy as np
    from flwr.common import bytes_to_ndarray, ndarray_to_bytes

    ins = instructions(plan)
    scales = bytes_to_ndarray(ins.config["secagg_scales"]).copy()
    scales[0] = scale
    ins.config["secagg_scales"] = ndarray_to_bytes(np.asarray(scales))
    with pytest.raises(RoundRefused, match="scales"):
        client(plan, tmp_path).fit(ins)


def test_a_node_whose_ledger_is_unreadable_says_nothing_about_it_to_the_server(plan, tmp_path):
    from privfed.federation.client_app import NodeGuardFailed

    folder = tmp_path / "state"
    folder.mkdir()
    (folder / f"privfed-ledger-partition-{PARTITION}.jsonl").write_text('{"client": 0, "rou')
    with pytest.raises(NodeGuardFailed) as failure:
        client(plan, tmp_path)
    assert "state" not in str(failure.value) and "line" not in str(failure.value)


def test_the_round_draws_from_the_declared_seed_whatever_seed_the_fit_config_names(plan, tmp_path):
    """A deviating server that names another seed gets the same augmentations, memory and release."""
    import numpy as np
    from flwr.common import parameters_to_ndarrays

    honest = instructions(plan)
    renamed = instructions(plan)
    renamed.config["seed"] = int(renamed.config["seed"]) + 12345
    first = client(plan, tmp_path / "a").fit(honest)
    second = client(plan, tmp_path / "b").fit(renamed)
    assert all(np.array_equal(a, b) for a, b in zip(parameters_to_ndarrays(first.parameters), parameters_to_ndarrays(second.parameters)))
