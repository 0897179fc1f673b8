"""The server-side driver: everything around the rounds on the server.

It builds, evaluates and checkpoints the initial model, hands every finished
round to its observers (:mod:`privfed.run.observers`) around the round's
``metrics.jsonl`` line, and writes the summary. Whichever FL runtime delivers
the rounds calls :meth:`RunDriver.on_round_end` with a
:class:`~privfed.orchestra.round_report.RoundReport`.

A round's end, in this order (the write order is what makes a kill
anywhere in it safe to resume, ``tests/run/test_kill_window.py``):

1. :class:`~privfed.run.observers.ledger_charge.ChargeReleases`: ledger lines for the releases.
2. :class:`~privfed.run.observers.release_recording.RecordReleases` (``--record-releases``): ``releases/round-XXXX.pt``.
3. :class:`~privfed.run.observers.ledger_charge.ChargeTraining`: ledger lines for DP-SGD steps.
4. :class:`~privfed.run.observers.stop_rules.StopRules`: unusable round, no update, budget.
5. :class:`~privfed.run.observers.monitor.KnnEvaluation`: kNN accuracy when due.
6. The driver: the ``metrics.jsonl`` line and the progress display's round event.
7. :class:`~privfed.run.observers.stop_rules.StopRules`: Ctrl-C or SIGTERM.
8. :class:`~privfed.run.observers.resume_point.SaveResumePoint`: ``checkpoints/resume.pt``, last.

Steps 1 to 5 are ``after_round`` hooks, 7 and 8 ``after_metrics`` ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from mechanisms import get_mechanism_class
from mechanisms.base import SecureSumMechanism, TableReleaseMechanism
from privfed.data import heterogeneity_stats
from privfed.device import resolve_device
from privfed.methods import STEP_VALUES, build_network, get_method
from privfed.orchestra.round_report import RoundReport
from privfed.orchestra.server import OrchestraServer
from privfed.privacy import PrivacyLedger
from privfed.privacy.statement import leaked_share_cost, privacy_statement
from privfed.run.curves import save_run_curves
from privfed.run.interruption import StopRequest
from privfed.run.observers.base import FinishedRound, RoundObserver
from privfed.run.observers.ledger_charge import (
    IN_PROGRESS_STATEMENT as IN_PROGRESS_STATEMENT,  # re-exported: privfed.studies.cell_work reads it here
)
from privfed.run.observers.ledger_charge import ChargeReleases, ChargeTraining
from privfed.run.observers.monitor import KnnEvaluation, build_monitor
from privfed.run.observers.release_recording import RecordReleases
from privfed.run.observers.resume_point import SaveResumePoint
from privfed.run.observers.stop_rules import StopRules
from privfed.run.plan import RunPlan
from privfed.run.resume import SUMMARY_FILE, ResumePoint, ended_cleanly, mark_end
from privfed.run.stop import Stop

ProgressCallback = Callable[[dict[str, Any]], None]

#: Largest magnitude a client's metric counts with in a round's mean: far beyond any honest loss or duration,
#: and so far below float's limit that a mean of many capped values cannot overflow.
METRIC_CAP = 1e300


def _mean(values: list[float]) -> float | None:
    """The mean of clients' metrics (None without any), each capped at :data:`METRIC_CAP`: they are only checked
    to be finite, and two of 1.7e308 would overflow a plain mean."""
    if not values:
        return None
    capped = [min(max(v, -METRIC_CAP), METRIC_CAP) for v in values]
    return math.fsum(v / len(capped) for v in capped)


def metrics_line(report: RoundReport) -> dict[str, Any]:
    """The round's ``metrics.jsonl`` line as the report gives it, before the observers add to it."""
    line: dict[str, Any] = {
        "round": report.round,
        "task": "init" if report.round == 0 else "train",
        "clients_sampled": report.sampled,
        "sampled_clients": list(report.sampled_clients),
        "clients_completed": report.completed,
        "client_failures": report.failures,
        "rejected_replies": len(report.rejected),
        "rejection_reasons": [asdict(r) for r in report.rejected],
        "round_seconds": report.seconds,
        **report.server_stats,
    }
    for key in (*STEP_VALUES, "train_seconds", "release_seconds"):
        if key not in line:  # SecAgg+ rounds bring the means of the secure sum in server_stats (if reported)
            line[key] = _mean([m[key] for m in report.client_metrics if key in m])
    return line


class RunDriver:
    """One run's server-side bookkeeping, from initial model to summary."""

    def __init__(
        self, plan: RunPlan, progress: ProgressCallback | None = None, *, stop: StopRequest | None = None,
        resume: ResumePoint | None = None,
    ) -> None:
        self.plan = plan
        self.stop_request = stop
        self.resume = resume
        self.config = plan.config
        self.run_dir = plan.run_dir
        self.progress = progress
        self.device = resolve_device(plan.config.device)
        self.method = get_method(plan.config.method)
        mechanism = plan.config.release_mechanism  # None: the method releases nothing
        self.mechanism_class = None if mechanism is None else get_mechanism_class(mechanism)
        self.observers: list[RoundObserver] = []
        self._start = time.perf_counter()
        self._last_loss: float | None = None
        self._rounds_done = 0
        #: The round a killed run had in progress when resumed (see :meth:`_forget_summary`), else None.
        self._killed_round: int | None = None

    @property
    def stop(self) -> Stop | None:
        """Why the run ends early (None while it goes on); :class:`StopRules` decides it."""
        return self.stop_rules.stop

    @stop.setter
    def stop(self, stop: Stop | None) -> None:
        self.stop_rules.stop = stop

    @property
    def stop_reason(self) -> str | None:
        """Why the run stops early, in words (None while it goes on)."""
        return self.stop_rules.reason

    def start(self) -> OrchestraServer:
        """Creates the run directory, the ledger, the initial model and its evaluation (resumed: from the point)."""
        config = self.config
        if self.resume is None:
            self.run_dir.create(config)
        else:
            self._forget_summary(self.resume)
            self.run_dir.update_config(config)  # more rounds, another runtime: recorded before the next resume point
            self.run_dir.forget_rounds_after(self.resume.round)  # a round logged after the point is replayed
        self.ledger = PrivacyLedger.resume(
            self.run_dir.path / "ledger.jsonl", mechanism=self.mechanism_name, delta=self.plan.privacy.delta,
            reference_epsilon=self.plan.privacy.reference_epsilon,
        )
        monitor = build_monitor(self.plan, self.device)
        self.heterogeneity = heterogeneity_stats(monitor.train_labels.numpy(), self.plan.split.partition())
        self.server = self._build_server()
        self.knn = KnnEvaluation(monitor, self.server, config)
        self.stop_rules = StopRules(
            self.plan, self.ledger, request=self.stop_request, emit=self._emit, killed_round=self._killed_round
        )
        if self.resume is None:
            self.knn.initial = self.knn.evaluate()
            self.run_dir.save_checkpoint("initial", self.server.network, None, round_index=0)
        else:
            self._restore(self.resume)
        self.observers = self._observers()
        self._emit({"event": "start", "knn_accuracy_init": self.knn.initial, "rounds": config.rounds})
        return self.server

    def _build_server(self) -> OrchestraServer:
        config = self.config
        torch.manual_seed(config.seed)
        network = build_network(config)  # GroupNorm under DP-SGD, as on the clients
        cls, params = self.mechanism_class, self.plan.privacy.params
        aggregator = cls(**params) if cls is not None and issubclass(cls, SecureSumMechanism) else None
        table_summing = cls(**params) if cls is not None and issubclass(cls, TableReleaseMechanism) else None
        return OrchestraServer(
            network, num_global_centroids=config.num_global_centroids, seed=config.seed, method=self.method,
            global_clustering=config.global_clustering, cluster_temperature=config.temperature, aggregator=aggregator,
            table_summing=table_summing,
        )

    def _observers(self) -> list[RoundObserver]:
        """The round observers in the order the module docstring gives; built once the server holds its first state."""
        killed = self._killed_round
        self.charge_releases = ChargeReleases(self.ledger, self.plan, self.mechanism_class, killed_round=killed)
        self.charge_training = ChargeTraining(self.ledger, self.plan, killed_round=killed)
        self.resume_points = SaveResumePoint(
            self.run_dir, self.server, self.config, stopping=lambda: self.stop is not None, figures=self._figures,
            mechanism_params=self.plan.privacy.params,
        )
        recording: list[RoundObserver] = []
        if self.config.record_releases:
            recording.append(RecordReleases(self.run_dir, self.server, self.mechanism_class, self.plan.privacy.params))
        return [self.charge_releases, *recording, self.charge_training, self.stop_rules, self.knn, self.resume_points]

    def _forget_summary(self, point: ResumePoint) -> None:
        """A resumed run is running again: its point stops saying it ended, then its old summary goes. Unless it
        ended cleanly at the point, the next round may have been in progress at the kill: its silent clients may
        have released and will not answer it again, so that round charges them too."""
        if not ended_cleanly(self.run_dir, point):
            self._killed_round = point.round + 1
        if point.summary_sha256 is not None:
            mark_end(self.run_dir, ended=False)
        (self.run_dir.path / SUMMARY_FILE).unlink(missing_ok=True)

    def _restore(self, point: ResumePoint) -> None:
        self.server.restore(
            network=point.network, centroids=point.centroids, initialised=point.initialised, generator=point.server_generator
        )
        figures = point.driver
        self.knn.restore(figures)
        self._last_loss = figures["last_loss"]
        self._rounds_done = point.round
        self.stop_rules.restore(figures, round_index=point.round)
        self._start = time.perf_counter() - figures["elapsed_seconds"]

    def _figures(self) -> dict[str, Any]:
        """The driver's running figures, as a resume point keeps them (:attr:`ResumePoint.driver`)."""
        return {
            **self.knn.figures(),
            "last_loss": self._last_loss,
            "elapsed_seconds": time.perf_counter() - self._start,
            **self.stop_rules.figures(),
        }

    def on_round_end(self, report: RoundReport) -> str | None:
        """Hands a finished round to the observers around its metrics line; returns a reason to stop, or None."""
        finished = FinishedRound(report, metrics_line(report))
        for observer in self.observers:
            observer.after_round(finished)
        self._log(finished)
        for observer in self.observers:
            observer.after_metrics(finished)
        return self.stop_reason

    def _log(self, finished: FinishedRound) -> None:
        """Appends the round's metrics line and tells the progress display."""
        line = finished.metrics
        if line["loss"] is not None and not math.isnan(line["loss"]):
            self._last_loss = line["loss"]
        line["elapsed_seconds"] = time.perf_counter() - self._start
        self.run_dir.append_metrics(line)
        self._rounds_done = finished.report.round
        self._emit({"event": "round", **line})

    @property
    def mechanism_name(self) -> str | None:
        """The release mechanism in force (None when the method releases nothing)."""
        return None if self.mechanism_class is None else self.mechanism_class.name

    def privacy_summary(self) -> dict[str, Any]:
        """``summary.json``'s ``privacy``: what the worst-off client is guaranteed, and what is not (``statement``)."""
        worst = self.ledger.worst_case_summary() if self.ledger.is_dp else None
        plan = self.plan.privacy
        statement = privacy_statement(
            mechanism=self.mechanism_class,
            dp_sgd=plan.dp_sgd is not None,
            worst=worst,
            # Nothing released: the mechanism's own floor, which every centroid it could have released meets.
            k=self.ledger.min_k if self.ledger.min_k is not None else plan.params.get("min_k"),
            secagg=self.plan.secagg is not None,
            method=self.method,
            report_metrics=self.config.report_client_metrics,
            release_sampling_rate=plan.sampling_rate,
            min_shares=plan.params.get("min_shares"),  # set for a secure-sum mechanism only
            leaked_shares=leaked_share_cost(plan),
        )
        dp_sgd = None
        if plan.dp_sgd is not None and worst is not None:
            dp_sgd = {**plan.dp_sgd.to_dict(), "epsilon": worst.dp_sgd_worst}
        return {
            "mechanism": self.mechanism_name,
            "epsilon": None if worst is None else worst.epsilon,
            "delta": None if worst is None else worst.delta,
            "k": self.ledger.min_k,
            "worst_case_client": None if worst is None else worst.client,
            "budget": plan.budget,
            "epsilon_per_release": plan.epsilon_per_release,
            "releases_epsilon": worst.releases_worst if worst is not None and plan.is_dp else None,
            "dp_sgd": dp_sgd,
            **statement.to_dict(),
        }

    def finish(self, *, secure_aggregation: dict[str, Any]) -> dict[str, Any]:
        """Final checkpoint, ``summary.json`` (with the runtime's ``secure_aggregation`` account) and
        ``curves.png``; then the resume point records that the run ended."""
        self.run_dir.save_checkpoint("final", self.server.network, self.server.centroids, self._rounds_done)
        self.stop_rules.at_end(self._rounds_done)
        knn = self.knn.final(self._rounds_done)
        privacy = self.privacy_summary()
        summary = {
            "knn_accuracy": knn,
            "knn_accuracy_init": self.knn.initial,
            "rounds": self._rounds_done,
            "wall_seconds": time.perf_counter() - self._start,
            "method": {
                "name": self.method.name,
                "description": self.method.description,
                "loss": self.method.loss,
                "releases": self.method.releases,
            },
            "mechanism": {"name": self.mechanism_name, "params": self.plan.privacy.params},  # its guarantee: ``privacy``
            "privacy": privacy,
            "secure_aggregation": secure_aggregation,
            "stopped_early": self.stop_reason,
            "stop": None if self.stop is None else self.stop.to_dict(),
            "rejected_replies": self._rejected_replies(),
            "heterogeneity": vars(self.heterogeneity),
            "final_loss": self._last_loss,
            "run_dir": str(self.run_dir.path),
        }
        self.run_dir.write_json(SUMMARY_FILE, summary)
        save_run_curves(self.run_dir)
        mark_end(self.run_dir, ended=True)
        self._emit({"event": "finish", **summary})
        return summary

    def _rejected_replies(self) -> dict[str, Any]:
        """Every rejected reply of the run, from ``metrics.jsonl`` (which a resumed run continues)."""
        replies = [{"round": m["round"], **r} for m in self.run_dir.metrics() for r in m.get("rejection_reasons", [])]
        return {"count": len(replies), "replies": replies}

    def _emit(self, event: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress(event)
