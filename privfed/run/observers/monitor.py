"""The kNN monitor on the server: the global encoder's kNN accuracy, every ``--eval-every`` rounds and at the last."""

from __future__ import annotations

from typing import Any

import torch

from privfed.config import TrainConfig
from privfed.data import cached_dataset
from privfed.evaluation.monitor import KnnMonitor
from privfed.orchestra.server import OrchestraServer
from privfed.run.observers.base import FinishedRound, RoundObserver
from privfed.run.plan import RunPlan


def build_monitor(plan: RunPlan, device: torch.device) -> KnnMonitor:
    """kNN monitor: the run's training images as reference, its test split as queries."""
    config = plan.config
    train = plan.split.train_data()
    test = cached_dataset(config.test_dataset or config.dataset, "test", config.data_dir, config.download)
    return KnnMonitor(
        train_images=train.to_tensor(),
        train_labels=torch.as_tensor(train.labels),
        test_images=test.to_tensor(),
        test_labels=torch.as_tensor(test.labels),
        device=device,
        k=config.knn_k,
        temperature=config.knn_temperature,
    )


class KnnEvaluation(RoundObserver):
    """Adds ``knn_accuracy`` to a due round's metrics line; keeps the untrained and the latest accuracy."""

    def __init__(self, monitor: KnnMonitor, server: OrchestraServer, config: TrainConfig) -> None:
        self.monitor = monitor
        self.server = server
        self.config = config
        self.initial: float | None = None
        self.latest: float | None = None

    def evaluate(self) -> float:
        """The kNN accuracy of the server's encoder as it is now."""
        return self.monitor(self.server.network.online.backbone)

    def due(self, round_index: int) -> bool:
        """Every ``--eval-every`` training rounds and the last one (never round 0, which does not train)."""
        config = self.config
        return round_index > 0 and (round_index % config.eval_every == 0 or round_index == config.rounds)

    def after_round(self, finished: FinishedRound) -> None:
        if self.due(finished.report.round):
            self.latest = self.evaluate()
            finished.metrics["knn_accuracy"] = self.latest

    def final(self, rounds_done: int) -> float:
        """The accuracy for the summary: the latest, or a fresh one when no training round was evaluated."""
        if self.latest is None or rounds_done == 0:
            self.latest = self.evaluate()
        return self.latest

    def restore(self, figures: dict[str, Any]) -> None:
        self.initial, self.latest = figures["knn_init"], figures["last_knn"]

    def figures(self) -> dict[str, Any]:
        """What a resume point keeps of the monitor."""
        return {"knn_init": self.initial, "last_knn": self.latest}
