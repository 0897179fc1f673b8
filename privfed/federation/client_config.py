"""The part of a run's configuration a client reads, and nothing more.

The server sends it with every fit instruction (as JSON). It is built from
the run's :class:`privfed.config.TrainConfig`, so it cannot drift from what
the server planned; the options only the server uses (rounds, privacy
budgets, SecAgg+ parameters, evaluation, output) never reach a client.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from privfed.config import TrainConfig
from privfed.data.federated import FederatedSplit
from privfed.methods import build_network
from privfed.models.network import OrchestraNetwork
from privfed.orchestra.local_training import LocalTrainingConfig


@dataclass(frozen=True)
class ClientConfig:
    """Everything a client needs to take part in a round, apart from the server's per-round state.

    Attributes:
        split: Which images each client holds.
        method: The run's method (:mod:`privfed.methods`): whether to release.
        backbone: Backbone name.
        projection_dim: Projector output dimension D.
        projection_hidden_dim: Projector hidden width (None: D).
        cluster_head_outputs: SpecLoss's cluster head width (None for every other method).
        classifier_outputs: Supervised FedAvg's classifier width (None for every other method).
        dp_sgd: Whether clients train with DP-SGD (GroupNorm networks); the
            DP-SGD settings themselves come from the server's plan.
        local: Local training hyperparameters (without DP-SGD settings).
        mechanism: Release mechanism name (None when the method releases nothing).
        num_local_centroids: ``L``.
        device: ``auto``, ``cpu`` or ``cuda``.
        threads: CPU threads a client may use.
        report_client_metrics: Whether the client sends its training metrics
            (``--report-client-metrics``). A declared client follows its declared
            run's value and refuses instructions that carry another.
        seed: The run's seed. Each round's augmentations, memory and release
            draw from it, the round and the client, so within a declared run
            the server cannot pick them (in deployment the declared run, seed
            included, is the run config the server's operator submits).
    """

    split: FederatedSplit
    method: str
    backbone: str
    projection_dim: int
    projection_hidden_dim: int | None
    cluster_head_outputs: int | None
    classifier_outputs: int | None
    dp_sgd: bool
    local: LocalTrainingConfig
    mechanism: str | None
    num_local_centroids: int
    device: str
    threads: int
    report_client_metrics: bool
    seed: int

    @classmethod
    def of(cls, config: TrainConfig) -> ClientConfig:
        return cls(
            split=FederatedSplit.of(config),
            method=config.method,
            backbone=config.backbone,
            projection_dim=config.projection_dim,
            projection_hidden_dim=config.projection_hidden_dim,
            cluster_head_outputs=config.cluster_head_outputs,
            classifier_outputs=config.classifier_outputs,
            dp_sgd=config.dp_sgd,
            local=LocalTrainingConfig.from_run(config),
            mechanism=config.release_mechanism,
            num_local_centroids=config.num_local_centroids,
            device=config.device,
            threads=max(1, int(config.client_cpus)),
            report_client_metrics=config.report_client_metrics,
            seed=config.seed,
        )

    def differences(self, other: ClientConfig) -> list[str]:
        """The fields whose values differ from ``other``'s (compared as the JSON both travel as)."""
        mine, theirs = json.loads(self.to_json()), json.loads(other.to_json())
        return sorted(k for k in mine if mine[k] != theirs.get(k))

    def build_network(self) -> OrchestraNetwork:
        """The run's network architecture (GroupNorm under DP-SGD), as the server built it."""
        return build_network(self)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ClientConfig:
        values = json.loads(text)
        local = LocalTrainingConfig.from_dict(values.pop("local"))
        return cls(split=FederatedSplit(**values.pop("split")), local=local, **values)
