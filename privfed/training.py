"""The training driver: everything around the rounds on the server side.

It builds the initial model, evaluates and checkpoints it, receives every
finished round from the strategy (metrics, kNN monitor, progress display)
and writes the summary at the end. It does not know which FL runtime
delivers the rounds.
"""

from __future__ import annotations

import math
import statistics
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from privfed.config import TrainConfig
from privfed.data import ImageArrays, dirichlet_partition, heterogeneity_stats, load_dataset
from privfed.device import resolve_device
from privfed.errors import PrivfedError
from privfed.evaluation.monitor import KnnMonitor
from privfed.federation.secure_aggregation import SecAggPlusSettings, secagg_settings
from privfed.federation.strategy import OrchestraStrategy, RoundReport
from privfed.models.network import build_network
from privfed.orchestra.server import OrchestraServer
from privfed.privacy import PrivacyLedger, PrivacyPlan, plan_privacy
from privfed.privacy.ledger import LedgerEntry
from privfed.privacy.statement import privacy_statement
from privfed.runs import RunDirectory

ProgressCallback = Callable[[dict[str, Any]], None]


@lru_cache(maxsize=4)
def _cached_dataset(spec: str, split: str, data_dir: str, download: bool) -> ImageArrays:
    return load_dataset(spec, split=split, data_dir=Path(data_dir), download=download)  # type: ignore[arg-type]


def run_datasets(config: TrainConfig) -> tuple[ImageArrays, ImageArrays]:
    """The run's training data and the kNN monitor's test data (cached per process)."""
    train = _cached_dataset(config.dataset, "train", config.data_dir, config.download)
    test = _cached_dataset(config.test_dataset or config.dataset, "test", config.data_dir, config.download)
    return train, test


def client_partition(config: TrainConfig) -> list[np.ndarray]:
    """Each client's sample indices under the run's seeded Dirichlet split."""
    train, _ = run_datasets(config)
    return dirichlet_partition(train.labels, num_clients=config.num_clients, alpha=config.alpha, seed=config.seed)


def preflight(config: TrainConfig) -> PrivacyPlan:
    """Fails fast, before any runtime starts, on data or a budget the run cannot use."""
    if config.out is not None and RunDirectory(Path(config.out)).holds_a_run():
        raise PrivfedError(f"{config.out} already holds a run; choose another --out")
    sizes = [len(p) for p in client_partition(config)]
    secagg_settings(config, sizes)
    return plan_privacy(config, sizes)


def build_monitor(config: TrainConfig, device: torch.device) -> KnnMonitor:
    """kNN monitor: the run's training images as reference, its test split as queries."""
    train, test = run_datasets(config)
    return KnnMonitor(
        train_images=train.to_tensor(),
        train_labels=torch.as_tensor(train.labels),
        test_images=test.to_tensor(),
        test_labels=torch.as_tensor(test.labels),
        device=device,
        k=config.knn_k,
        temperature=config.knn_temperature,
    )


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


class TrainingRun:
    """One run's server-side bookkeeping, from initial model to summary."""

    def __init__(self, config: TrainConfig, run_dir: RunDirectory, progress: ProgressCallback | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.progress = progress
        self.device = resolve_device(config.device)
        self._start = time.perf_counter()
        self._last_knn: float | None = None
        self._last_loss: float | None = None
        self._rounds_done = 0

    def start(self) -> OrchestraStrategy:
        """Plans the privacy budget, creates the run directory, the initial model and its evaluation."""
        parts = client_partition(self.config)
        self.secagg: SecAggPlusSettings | None = secagg_settings(self.config, [len(p) for p in parts])
        self.client_sizes = [len(p) for p in parts]
        self.plan = plan_privacy(self.config, self.client_sizes)
        self.config = config = self.config.replace(delta=self.plan.delta)  # record the delta in force
        self.run_dir.create(config)
        self.ledger = PrivacyLedger(
            mechanism=config.mechanism,
            delta=self.plan.delta,
            reference_epsilon=config.epsilon or config.epsilon_per_release or 1.0,
            path=self.run_dir.path / "ledger.jsonl",
        )
        self.monitor = build_monitor(config, self.device)
        self.heterogeneity = heterogeneity_stats(self.monitor.train_labels.numpy(), parts)
        torch.manual_seed(config.seed)
        network = build_network(config)  # GroupNorm under DP-SGD, as on the clients
        self.knn_init = self.monitor(network.online.backbone)
        self.run_dir.save_checkpoint("initial", network, None, round_index=0)
        self.server = OrchestraServer(network, num_global_centroids=config.num_global_centroids, seed=config.seed)
        self._emit({"event": "start", "knn_accuracy_init": self.knn_init, "rounds": config.rounds})
        self.strategy = OrchestraStrategy(
            self.server,
            config,
            self.on_round_end,
            mechanism_params=self.plan.params,
            secagg=self.secagg,
            dp_sgd=None if self.plan.dp_sgd is None else self.plan.dp_sgd.settings,
        )
        return self.strategy

    def on_round_end(self, report: RoundReport) -> None:
        """Logs a finished round; evaluates when due."""
        config = self.config
        record: dict[str, Any] = {
            "round": report.round,
            "task": "init" if report.round == 0 else "train",
            "clients_sampled": report.sampled,
            "clients_completed": report.completed,
            "client_failures": report.failures,
            "round_seconds": report.seconds,
            **report.server_stats,
        }
        for key in ("loss", "cluster_loss", "rotation_loss", "train_seconds", "release_seconds"):
            record[key] = _mean([m[key] for m in report.client_metrics if key in m])
        if "min_k" in record:
            record["min_k"] = int(record["min_k"])
        for client, release in report.releases:
            self.ledger.record(LedgerEntry(client, report.round, self.config.mechanism, release.guarantee, release.events))
        self._record_training(report)
        if self.ledger.is_dp:
            worst = self.ledger.worst_case_summary()
            record.update(privacy_epsilon=worst.epsilon, privacy_delta=worst.delta, privacy_worst_client=worst.client)
            if self.plan.dp_sgd is not None:
                record["privacy_dp_sgd_epsilon"] = worst.dp_sgd_worst
            if self.plan.is_dp:
                record["privacy_releases_epsilon"] = worst.releases_worst
            self._stop_if_budget_runs_out(report.round)
        due = report.round > 0 and (report.round % config.eval_every == 0 or report.round == config.rounds)
        if due:
            self._last_knn = self.monitor(self.server.network.online.backbone)
            record["knn_accuracy"] = self._last_knn
        if record["loss"] is not None and not math.isnan(record["loss"]):
            self._last_loss = record["loss"]
        record["elapsed_seconds"] = time.perf_counter() - self._start
        self.run_dir.append_metrics(record)
        self._rounds_done = report.round
        self._emit({"event": "round", **record})

    def _record_training(self, report: RoundReport) -> None:
        """Charges each client's DP-SGD steps to the ledger, after checking them against the plan.

        Every reply counts, also in a round whose secure aggregation halted:
        the client trained and sent its (masked) update either way.
        """
        if self.plan.dp_sgd is None:
            return
        for client, events in report.training_events:
            if not events:
                continue
            expected = self.plan.dp_sgd.round_events(self.client_sizes[client])
            if events != expected:
                raise RuntimeError(f"client {client} reports DP-SGD costs {events}, the plan expects {expected}")
            self.ledger.record(LedgerEntry.dp_sgd(client, report.round, events))

    def _stop_if_budget_runs_out(self, round_index: int) -> None:
        """Stops before the round whose releases could take a client past its budget."""
        if self.plan.budget is None or round_index >= self.config.rounds:
            return
        projected = self.ledger.worst_case_after(self.plan.per_release_events)
        if projected > self.plan.budget:
            self.strategy.stop(
                f"privacy budget: another release would bring a client to epsilon {projected:.3f} "
                f"> {self.plan.budget} (delta {self.plan.delta:.2g}); stopped after round {round_index}"
            )
            self._emit({"event": "stop", "reason": self.strategy.stop_reason})

    def privacy_summary(self) -> dict[str, Any]:
        """The ``privacy`` object of ``summary.json``: what the worst-off client is guaranteed, and what is not covered."""
        worst = self.ledger.worst_case_summary() if self.ledger.is_dp else None
        statement = privacy_statement(
            mechanism=self.config.mechanism,
            mechanism_is_dp=self.plan.is_dp,
            dp_sgd=self.plan.dp_sgd is not None,
            worst=worst,
            k=self.ledger.min_k,
            secagg=self.secagg is not None,
        )
        dp_sgd = None
        if self.plan.dp_sgd is not None and worst is not None:
            dp_sgd = {**self.plan.dp_sgd.to_dict(), "epsilon": worst.dp_sgd_worst}
        return {
            "mechanism": self.config.mechanism,
            "epsilon": None if worst is None else worst.epsilon,
            "delta": None if worst is None else worst.delta,
            "k": self.ledger.min_k,
            "worst_case_client": None if worst is None else worst.client,
            "budget": self.plan.budget,
            "releases_epsilon": worst.releases_worst if worst is not None and self.plan.is_dp else None,
            "dp_sgd": dp_sgd,
            **statement.to_dict(),
        }

    def secure_aggregation_summary(self) -> dict[str, Any]:
        """Whether the server saw only sums of encoder updates, and the protocol's parameters."""
        if self.secagg is None:
            return {"enabled": False, "protocol": None}
        return {
            "enabled": True,
            "protocol": "SecAgg+ (Flower)",
            **self.secagg.to_dict(),
            "halted_rounds": self.strategy.halted_rounds,
            "rejected_tensor_updates": self.strategy.rejected_tensor_updates,
            "final_max_scale": float(self.strategy.scales.max()),
        }

    def finish(self) -> dict[str, Any]:
        """Final checkpoint and ``summary.json``."""
        config = self.config
        self.run_dir.save_checkpoint("final", self.server.network, self.server.centroids, self._rounds_done)
        if self._last_knn is None or self._rounds_done == 0:
            self._last_knn = self.monitor(self.server.network.online.backbone)
        privacy = self.privacy_summary()
        summary = {
            "knn_accuracy": self._last_knn,
            "knn_accuracy_init": self.knn_init,
            "rounds": self._rounds_done,
            "wall_seconds": time.perf_counter() - self._start,
            "mechanism": {"name": config.mechanism, "guarantee": privacy["statement"], "params": self.plan.params},
            "privacy": privacy,
            "secure_aggregation": self.secure_aggregation_summary(),
            "stopped_early": self.strategy.stop_reason,
            "heterogeneity": vars(self.heterogeneity),
            "final_loss": self._last_loss,
            "run_dir": str(self.run_dir.path),
        }
        self.run_dir.write_json("summary.json", summary)
        self._emit({"event": "finish", **summary})
        return summary

    def _emit(self, event: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress(event)
