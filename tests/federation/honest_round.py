"""A real strategy in a real round, and honest replies from the real client, for tests to tamper with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from flwr.common import FitRes, ndarrays_to_parameters

from mechanisms import get_mechanism_class
from privfed.config import TrainConfig, build_config
from privfed.federation.client import OrchestraClient
from privfed.federation.client_config import ClientConfig
from privfed.federation.reply_checks import ReplyRules
from privfed.federation.strategy import OrchestraStrategy
from privfed.methods import NO_CENTROIDS, build_network, get_method
from privfed.orchestra.model_state import shared_keys
from privfed.orchestra.round_report import RoundReport
from privfed.orchestra.server import OrchestraServer
from privfed.run.plan import RunPlan, plan_run

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
        return OrchestraClient(client_id=client).fit(ins)

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
        ClientConfig.of(plan.config),
        reports.append,
        clients_per_round=len(sampled),
        seed=config.seed,
        partition_of={NODE_OFFSET + p: p for p in range(config.num_clients)},
        reply_rules=ReplyRules.of(plan, mechanism_class),
        mechanism_params=plan.privacy.params,
        secagg=plan.secagg,
        dp_sgd=None if plan.privacy.dp_sgd is None else plan.privacy.dp_sgd.settings,
    )
    strategy._sampled_ids = sampled  # as configure_fit would have
    strategy._configured_round = server_round = 2 if train else 1
    return HonestRound(plan, strategy, server_round=server_round, reports=reports)
