"""The part of a run's configuration a client reads, and nothing more.

Each client builds it from its declared run (:class:`privfed.config.TrainConfig`),
the same configuration the server planned from; nothing of it travels in a
round. The options only the server uses (rounds, privacy budgets, SecAgg+
parameters, evaluation, output) are not in it.
"""

from __future__ import annotations

from dataclasses import dataclass

from privfed.config import TrainConfig
from privfed.data.federated import FederatedSplit
from privfed.models.network import OrchestraNetwork, build_network
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
            DP-SGD settings themselves are the client's own calibration
            (:mod:`privfed.privacy.client_guard`).
        local: Local training hyperparameters (without DP-SGD settings).
        mechanism: Release mechanism name (None when the method releases nothing).
        num_local_centroids: ``L``.
        device: ``auto``, ``cpu`` or ``cuda``.
        threads: CPU threads a client may use.
        report_client_metrics: Whether the client sends its training metrics
            (``--report-client-metrics``).
        seed: The run's seed. Each round's augmentations, memory and release
            draw from it, the round and the client, so the server cannot pick
            them (in deployment the declared run, seed included, is the run
            config the server's operator submits).
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

    def build_network(self) -> OrchestraNetwork:
        """The run's network architecture (GroupNorm under DP-SGD), as the server built it."""
        return build_network(self)
