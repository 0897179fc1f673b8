"""A real strategy in a real round, and honest replies from the real client, for tests to tamper with."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from flwr.app import Context, RecordDict
from flwr.common import FitIns, FitRes, ndarrays_to_parameters

from mechanisms import get_mechanism_class
from mechanisms.base import Guarantee, Release
from privfed.config import TrainConfig, build_config
from privfed.data.federated import FederatedSplit
from privfed.federation.client import OrchestraClient
from privfed.federation.client_app import make_client_fn
from privfed.federation.messages import RELEASE_KEYS, bytes_to_tensor
from privfed.federation.reply_checks import ReplyRules
from privfed.federation.strategy import OrchestraStrategy
from privfed.methods import NO_CENTROIDS, build_network, get_method
from privfed.orchestra.model_state import StateDict, shared_keys
from privfed.orchestra.round_report import RoundReport
from privfed.orchestra.server import OrchestraServer
from privfed.privacy.ledger import events_from_json
from privfed.run.plan import RunPlan, plan_run
from privfed.secagg.settings import SecAggPlusSettings, secagg_settings

#: Node ids are not partition ids: the strategy must map one to the other.
NODE_OFFSET = 100


def small_round_config(**changes) -> TrainConfig:
    """Four clients, two sampled, a tiny network: a real round in about a second."""
    return build_config(**{
        "dataset": "shapes:300", "num_clients": 4, "participation": 0.5, "backbone": "resnet8", "projection_dim": 16,
        "local_epochs": 1, "batch_size": 16, "memory_size": 32, "num_local_centroids": 4, "num_global_centroids": 8,
        "rounds": 1, "secagg": False, "seed": 0, **changes,
    })


@dataclass(frozen=True)
class Node:
    """What the strategy reads of a ClientProxy: its node id."""

    node_id: int


@dataclass
class HonestRound:
    """A strategy about to aggregate a round, the plan behind it, and what its hook received."""

    plan: RunPlan
    strategy: OrchestraStrategy
    server_round: int
    reports: list[RoundReport] = field(default_factory=list)

    def reply(self, client: int) -> FitRes:
        """The real client's reply to this round's instructions."""
        keys = shared_keys(self.strategy.server.network)
        state = ndarrays_to_parameters([self.strategy.server.global_state()[k].numpy() for k in keys])
        ins = self.strategy.fit_instructions(self.server_round, state)
        return declared_client(self.plan.config, client).fit(ins)

    @staticmethod
    def node(client: int) -> Node:
        return Node(NODE_OFFSET + client)


def honest_round(config: TrainConfig, out: Path, *, train: bool = True, sampled: tuple[int, ...] = (0, 1)) -> HonestRound:
    """A planned run's strategy with ``sampled`` clients asked for round 1 (``train``) or round 0."""
    plan = plan_run(config.replace(out=str(out)))
    torch.manual_seed(config.seed)
    method = get_method(config.method)
    server = OrchestraServer(build_network(plan.config), num_global_centroids=config.num_global_centroids, seed=0, method=method)
    if train:
        server.initialised = True
    if train and method.centroids != NO_CENTROIDS:
        server.centroids = torch.nn.functional.normalize(torch.randn(config.num_global_centroids, config.projection_dim), dim=1)
    mechanism = plan.config.release_mechanism
    mechanism_class = None if mechanism is None else get_mechanism_class(mechanism)
    reports: list[RoundReport] = []
    strategy = OrchestraStrategy(
        server,
        reports.append,
        clients_per_round=len(sampled),
        seed=config.seed,
        partition_of={NODE_OFFSET + p: p for p in range(config.num_clients)},
        reply_rules=ReplyRules.of(plan, mechanism_class),
        secagg=plan.secagg,
    )
    strategy._sampled_ids = sampled  # as configure_fit would have
    strategy._configured_round = server_round = 2 if train else 1
    return HonestRound(plan, strategy, server_round=server_round, reports=reports)


def declared_client(config: TrainConfig, client: int = 1, state_dir: Path | None = None, *, run: int = 1) -> OrchestraClient:
    """The client the ClientApp builds for partition ``client`` of the declared run ``config`` (Flower run ``run``)."""
    node = {"partition-id": client, "num-partitions": config.num_clients}
    client_fn = make_client_fn(config, state_dir)
    built = client_fn(Context(run_id=run, node_id=1, node_config=node, state=RecordDict(), run_config={}))
    assert isinstance(built, OrchestraClient)
    return built


def instructions(
    config: TrainConfig, *, train: bool = True, secagg: SecAggPlusSettings | str | None = "declared",
    state: StateDict | None = None,
) -> FitIns:
    """The real strategy's fit instructions for round 1 (``train``) or round 0 of ``config``, as an honest server
    sends them (its own SecAgg+ settings if ``secagg`` names some, its own ``state`` if given)."""
    torch.manual_seed(0)
    method = get_method(config.method)
    server = OrchestraServer(build_network(config), num_global_centroids=config.num_global_centroids, seed=0, method=method)
    if train:
        server.initialised = True
        if method.centroids != NO_CENTROIDS:
            server.centroids = F.normalize(torch.randn(config.num_global_centroids, config.projection_dim), dim=1)
    if secagg == "declared":
        secagg = secagg_settings(config, FederatedSplit.of(config).client_sizes())
    assert not isinstance(secagg, str)
    strategy = OrchestraStrategy(
        server, lambda report: None, clients_per_round=config.clients_per_round, seed=config.seed, secagg=secagg
    )
    state = server.global_state() if state is None else state
    arrays = [state[k].numpy() for k in shared_keys(server.network)]
    return strategy.fit_instructions(server_round=2 if train else 1, parameters=ndarrays_to_parameters(arrays))


def decode_release(metrics: dict) -> Release:
    """A reply's release as the client encoded it, unchecked (the server's checked reading is ``check_reply``)."""
    missing = [k for k in RELEASE_KEYS if k not in metrics and k != "release_table"]  # a table release: see check_reply
    assert not missing, f"client reply lacks {missing}"
    return Release(
        vectors=bytes_to_tensor(metrics["release_vectors"]),
        weights=bytes_to_tensor(metrics["release_weights"]),
        guarantee=Guarantee(**json.loads(metrics["release_guarantee"])),
        events=events_from_json(metrics["release_events"]),
    )
