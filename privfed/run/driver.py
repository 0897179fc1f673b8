"""The server-side driver: everything around the rounds on the server.

It builds the initial model, evaluates and checkpoints it, receives every
finished round (metrics, privacy ledger, budget stop, kNN monitor, progress
display) and writes the summary at the end. It does not know which FL
runtime delivers the rounds: the runtime calls :meth:`RunDriver.on_round_end`
with a :class:`privfed.orchestra.round_report.RoundReport` (see
:mod:`privfed.federation.server_app`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from mechanisms import get_mechanism_class
from mechanisms.base import DIFFERENTIAL_PRIVACY, K_ANONYMITY, NO_GUARANTEE, Guarantee, Mechanism
from privfed.data import cached_dataset, heterogeneity_stats
from privfed.device import resolve_device
from privfed.evaluation.monitor import KnnMonitor
from privfed.methods import STEP_VALUES, build_network, get_method
from privfed.orchestra.round_report import RoundReport
from privfed.orchestra.server import OrchestraServer
from privfed.privacy import PrivacyLedger
from privfed.privacy.ledger import LedgerEntry
from privfed.privacy.statement import privacy_statement
from privfed.run.curves import save_run_curves
from privfed.run.interruption import StopRequest
from privfed.run.plan import RunPlan
from privfed.run.recording import RecordedRound, write_round
from privfed.run.resume import SUMMARY_FILE, ResumePoint, ended_cleanly, mark_end, write_resume_point
from privfed.run.stop import (
    BUDGET,
    BUDGET_STOP,
    INTERRUPTED,
    NO_UPDATE_LIMIT,
    NO_UPDATES,
    RUNTIME_ENDED,
    UNUSABLE_ROUND,
    Stop,
)

ProgressCallback = Callable[[dict[str, Any]], None]

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


#: The guarantee recorded with the planned cost of a release the server rejected.
REJECTED_STATEMENT = "The server rejected this reply; it charges the planned cost, since the bytes reached it."
IN_PROGRESS_STATEMENT = (
    "The run was killed while this round was in progress and this client did not answer it again; it may "
    "have released before the kill, so the planned cost is charged."
)
#: The statements recorded with an accepted release, by guarantee kind: the server's words, never the client's.
ACCEPTED_STATEMENTS = {
    K_ANONYMITY: "Accepted; k is what the server credits (the least of the claim, the lightest centroid and the "
    "client's memory over its centroids; none when nothing was released).",
    DIFFERENTIAL_PRIVACY: "Accepted; charged the planned events of one release (epsilon and delta: one release alone).",
    NO_GUARANTEE: "Accepted; the release carries no protection.",
}


#: Largest magnitude a client's metric counts with in a round's mean: far beyond any honest loss or duration,
#: and so far below float's limit that a mean of many capped values cannot overflow.
METRIC_CAP = 1e300


def _mean(values: list[float]) -> float | None:
    """The mean of clients' metrics, each capped at :data:`METRIC_CAP` (or None without any).

    The values are the clients' own and only checked to be finite: two of
    1.7e308 would overflow a plain mean and end the run (round 0's metrics
    travel in plaintext even under SecAgg+).
    """
    if not values:
        return None
    capped = [min(max(v, -METRIC_CAP), METRIC_CAP) for v in values]
    return math.fsum(v / len(capped) for v in capped)


def _rejected_clients(report: RoundReport) -> list[int]:
    """Each identified client with a rejected reply this round, once, and not also among the accepted."""
    accepted = {client for client, _ in report.training_events}
    return sorted({r.client for r in report.rejected if r.client is not None} - accepted)


def _silent_clients(report: RoundReport) -> list[int]:
    """Sampled clients with neither an accepted nor a rejected reply this round."""
    answered = {c for c, _ in report.training_events} | {c for c, _ in report.releases} | set(_rejected_clients(report))
    return sorted(set(report.sampled_clients) - answered)


class RunDriver:
    """One run's server-side bookkeeping, from initial model to summary."""

    def __init__(
        self,
        plan: RunPlan,
        progress: ProgressCallback | None = None,
        *,
        stop: StopRequest | None = None,
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
        self.stop: Stop | None = None
        #: Why each training round since the last applied model update dropped its update (NO_UPDATE_LIMIT stops).
        self._dropped: list[str] = []
        self._start = time.perf_counter()
        self._last_knn: float | None = None
        self._last_loss: float | None = None
        self._rounds_done = 0
        self._round_maybe_answered: int | None = None

    @property
    def stop_reason(self) -> str | None:
        """Why the run stops early, in words (None while it goes on)."""
        return None if self.stop is None else self.stop.message

    def _stop(self, cause: str, round_index: int, message: str, *, overrides: bool = False) -> None:
        """Records the run's stop and tells the progress display; the first stands unless this one ``overrides`` it."""
        if self.stop is None or overrides:
            self.stop = Stop(cause, round_index, message)
            self._emit({"event": "stop", "reason": message, "cause": cause})

    def start(self) -> OrchestraServer:
        """Creates the run directory, the ledger, the initial model and its evaluation; returns the server.

        A resumed run keeps its directory and ledger, and its server starts
        where the resume point left it.
        """
        config = self.config
        privacy = self.plan.privacy
        if self.resume is None:
            self.run_dir.create(config)
        else:
            self._forget_summary(self.resume)
            self.run_dir.update_config(config)  # more rounds, another runtime: recorded before the next resume point
            self.run_dir.forget_rounds_after(self.resume.round)  # a round logged after the point is replayed
        self.ledger = PrivacyLedger.resume(
            self.run_dir.path / "ledger.jsonl",
            mechanism=self.mechanism_name,
            delta=privacy.delta,
            reference_epsilon=config.epsilon or config.epsilon_per_release or 1.0,
        )
        self.monitor = build_monitor(self.plan, self.device)
        self.heterogeneity = heterogeneity_stats(self.monitor.train_labels.numpy(), self.plan.split.partition())
        torch.manual_seed(config.seed)
        network = build_network(config)  # GroupNorm under DP-SGD, as on the clients
        self.server = OrchestraServer(
            network,
            num_global_centroids=config.num_global_centroids,
            seed=config.seed,
            method=self.method,
            global_clustering=config.global_clustering,
            cluster_temperature=config.temperature,
            aggregator=self._aggregator(),
        )
        if self.resume is None:
            self.knn_init = self.monitor(network.online.backbone)
            self.run_dir.save_checkpoint("initial", network, None, round_index=0)
        else:
            self._restore(self.resume)
        self._sent_state = self.server.global_state(), self.server.centroids
        self._emit({"event": "start", "knn_accuracy_init": self.knn_init, "rounds": config.rounds})
        return self.server

    def _forget_summary(self, point: ResumePoint) -> None:
        """A resumed run is running again: its point stops saying it ended, then its old summary goes.

        Unless the run ended cleanly at the point (:func:`privfed.run.resume.ended_cleanly`), the process was
        killed, possibly with the round after the point in progress: clients may have released in it and will
        not answer it again (``privfed.privacy.client_guard``), so that round charges its silent clients too.
        """
        if not ended_cleanly(self.run_dir, point):
            self._round_maybe_answered = point.round + 1
        if point.summary_sha256 is not None:
            mark_end(self.run_dir, ended=False)
        (self.run_dir.path / SUMMARY_FILE).unlink(missing_ok=True)

    def _restore(self, point: ResumePoint) -> None:
        self.server.restore(
            network=point.network, centroids=point.centroids, initialised=point.initialised, generator=point.server_generator
        )
        figures = point.driver
        self.knn_init = figures["knn_init"]
        self._last_knn, self._last_loss = figures["last_knn"], figures["last_loss"]
        self._rounds_done = point.round
        self._dropped = list(figures.get("dropped_updates", []))  # resume points before the stop rule lack it
        self._start = time.perf_counter() - figures["elapsed_seconds"]
        stop = figures.get("stop")  # points written before it was recorded lack it
        if stop is not None and point.round >= self.config.rounds:  # no round left: the run ends as it stopped
            self.stop = Stop(**stop)

    def _save_resume_point(self, report: RoundReport) -> None:
        """A resume point at the end of this round, when ``--checkpoint-every`` says so, at a stop, and at the end."""
        every = self.config.checkpoint_every
        due = (every > 0 and report.round % every == 0) or self.stop_reason is not None or report.round >= self.config.rounds
        if not due:
            return
        write_resume_point(
            self.run_dir,
            ResumePoint(
                round=report.round,
                network={k: v.detach().cpu().clone() for k, v in self.server.network.state_dict().items()},
                centroids=self.server.centroids,
                initialised=self.server.initialised,
                server_generator=self.server.generator_state(),
                runtime=report.runtime_state,
                driver={
                    "knn_init": self.knn_init,
                    "last_knn": self._last_knn,
                    "last_loss": self._last_loss,
                    "elapsed_seconds": time.perf_counter() - self._start,
                    "dropped_updates": list(self._dropped),
                    "stop_cause": None if self.stop is None else self.stop.cause,
                    "stop": None if self.stop is None else self.stop.to_dict(),
                },
            ),
        )

    def on_round_end(self, report: RoundReport) -> str | None:
        """Logs a finished round and evaluates when due; returns a reason to stop, or None."""
        config = self.config
        record: dict[str, Any] = {
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
            if key not in record:  # SecAgg+ rounds bring the means of the secure sum in server_stats (if reported)
                record[key] = _mean([m[key] for m in report.client_metrics if key in m])
        if report.unusable is not None:
            self._stop(UNUSABLE_ROUND, report.round, report.unusable)
        charged_ks = self._charge_releases(report)
        if config.record_releases:
            self._record_round(report)
        if charged_ks:
            record["min_k"] = min(charged_ks)
        self._record_training(report)
        self._stop_if_no_client_trained(report)
        self._stop_if_no_update_applies(report)
        if self.ledger.is_dp:
            worst = self.ledger.worst_case_summary()
            record.update(privacy_epsilon=worst.epsilon, privacy_delta=worst.delta, privacy_worst_client=worst.client)
            if self.plan.privacy.dp_sgd is not None:
                record["privacy_dp_sgd_epsilon"] = worst.dp_sgd_worst
            if self.plan.privacy.is_dp:
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
        stop = self.stop_request
        if stop is not None and stop.requested and report.round < config.rounds:
            self._stop(INTERRUPTED, report.round, f"{stop.reason}; stopped after round {report.round}")
        self._save_resume_point(report)
        return self.stop_reason

    def _record_round(self, report: RoundReport) -> None:
        """Keeps the round as the server saw it (``--record-releases``): the state it sent and the releases it got.

        The state every client of round r started from is the server's after
        round r-1 (or the initial one), which is why it is remembered here
        until the next round ends.
        """
        state, centroids = self._sent_state
        if self.mechanism_class is not None:
            recorded = RecordedRound.of(
                report.round,
                model_state=state,
                centroids=centroids,
                mechanism=self.mechanism_class.name,
                mechanism_params=self.plan.privacy.params,
                releases=report.releases,
            )
            write_round(self.run_dir.releases, recorded)
        self._sent_state = self.server.global_state(), self.server.centroids

    def _aggregator(self) -> Mechanism | None:
        """The server's side of an aggregated mechanism, from the plan's parameters (None for any other)."""
        if self.mechanism_class is None or not self.mechanism_class.aggregated:
            return None
        return self.mechanism_class(**self.plan.privacy.params)

    def _charge_releases(self, report: RoundReport) -> list[int]:
        """Charges every release that reached the server: the events the server planned, never the client's copy.

        The strategy has already checked each reply against the plan
        (:mod:`privfed.federation.reply_checks`): its events are the planned
        ones and, for a k-anonymous release, its guarantee's ``k`` is what
        the server credits. A rejected reply from a client the server asked
        is charged the planned events too (for DP mechanisms): its bytes
        reached the server, whatever was wrong with them. So is a sampled
        client's silence in the round a killed run had in progress
        (:meth:`_forget_summary`).

        Returns:
            The anonymity sets charged this round (k-anonymous releases only).
        """
        mechanism = self.mechanism_class
        expected = self.plan.privacy.per_release_events
        charged_ks: list[int] = []
        if mechanism is None:  # nothing released (the server refuses releases for such a method)
            return charged_ks
        if mechanism.aggregated:
            if report.round == 0:
                return charged_ks  # no secure sum, so no share
            # Each accepted reply's masked vector carries its share, whether or not the sum completed.
            for client, _ in report.training_events:
                self.ledger.record(LedgerEntry(client, report.round, mechanism.name, self._charged_guarantee(None), expected))
        for client, release in report.releases:
            k = release.guarantee.k if mechanism.guarantee_kind == K_ANONYMITY else None  # no k for other kinds
            if k is not None:
                charged_ks.append(k)
            self.ledger.record(LedgerEntry(client, report.round, mechanism.name, self._charged_guarantee(k), expected))
        if expected:
            rejected = Guarantee(kind=mechanism.guarantee_kind, statement=REJECTED_STATEMENT)
            for client in _rejected_clients(report):
                self.ledger.record(LedgerEntry(client, report.round, mechanism.name, rejected, expected))
            in_progress = Guarantee(kind=mechanism.guarantee_kind, statement=IN_PROGRESS_STATEMENT)
            for client in self._maybe_answered_before_a_kill(report):
                self.ledger.record(LedgerEntry(client, report.round, mechanism.name, in_progress, expected))
        return charged_ks

    def _charged_guarantee(self, k: int | None) -> Guarantee:
        """What the ledger records with an accepted release: the server's own facts, none of the client's text.

        The kind is the mechanism class's, ``k`` the one the checks credited,
        epsilon and delta the plan's for one release, and the statement the
        server's: a client's guarantee may claim anything (``"epsilon": -5``
        on a k-anonymous release, a 90 kB statement), and the ledger is what
        the run's privacy is read from.
        """
        kind = self.mechanism_class.guarantee_kind if self.mechanism_class is not None else NO_GUARANTEE
        privacy = self.plan.privacy
        dp = kind == DIFFERENTIAL_PRIVACY
        return Guarantee(
            kind=kind,
            statement=ACCEPTED_STATEMENTS.get(kind, ACCEPTED_STATEMENTS[NO_GUARANTEE]),
            k=k,
            epsilon=privacy.epsilon_per_release if dp else None,
            delta=privacy.delta if dp else None,
        )

    def _maybe_answered_before_a_kill(self, report: RoundReport) -> list[int]:
        """The silent clients of the round a killed run had in progress (none in any other round)."""
        return _silent_clients(report) if report.round == self._round_maybe_answered else []

    def _record_training(self, report: RoundReport) -> None:
        """Charges each client's DP-SGD steps as planned (the strategy checked the client's copy against the plan).

        Every reply counts, also in a round whose secure aggregation halted
        and a rejected one: the client trained and sent its (masked) update
        either way; so does silence in the round a killed run had in
        progress. Round 0 does not train.
        """
        dp_sgd = self.plan.privacy.dp_sgd
        if dp_sgd is None or report.round == 0:
            return
        clients = [client for client, _ in report.training_events] + _rejected_clients(report)
        for client in clients + self._maybe_answered_before_a_kill(report):
            self.ledger.record(LedgerEntry.dp_sgd(client, report.round, dp_sgd.round_events(self.plan.client_sizes[client])))

    def _stop_if_no_client_trained(self, report: RoundReport) -> None:
        """Stops after a round in which no sampled client's reply could be used.

        Every later round would go the same way (a setting no client can train
        with, replies the server rejects), so the run ends now with a summary
        that says why, and ``--resume`` can continue it once the cause is fixed.
        The round a killed run had in progress is exempt: its clients may have
        answered it before the kill and so stay silent (:meth:`_forget_summary`).
        """
        if report.completed > 0 or self.stop_reason is not None or report.round == self._round_maybe_answered:
            return
        rejected = report.rejected
        why = f"{len(rejected)} rejected" + (f": client {rejected[0].client}: {rejected[0].reason}" if rejected else "")
        failed = max(report.failures - len(rejected), 0)
        self._stop(
            UNUSABLE_ROUND,
            report.round,
            f"round {report.round}: no usable reply from its {report.sampled} sampled clients ({failed} failed, "
            f"{why}); the model is unchanged and the run stops",
        )

    def _stop_if_no_update_applies(self, report: RoundReport) -> None:
        """Stops after :data:`NO_UPDATE_LIMIT` training rounds in a row that applied no model update.

        Replies arrived, but every round dropped its update (a SecAgg+
        overflow, an implausible or halted secure sum): a run left to go on
        would end "done" with the model it started from.
        """
        if report.round == 0:
            return
        dropped = report.update_dropped if report.unusable is None else "no usable reply"  # neither applies an update
        if dropped is None:
            self._dropped = []
            return
        self._dropped.append(dropped)
        if len(self._dropped) < NO_UPDATE_LIMIT:
            return
        first = report.round - len(self._dropped) + 1
        reasons = "; ".join(dict.fromkeys(self._dropped))  # each reason once, in order
        self._stop(
            NO_UPDATES,
            report.round,
            f"rounds {first} to {report.round} applied no model update ({reasons}); the model is unchanged since "
            f"round {first - 1} and the run stops",
        )

    def _nothing_applied(self) -> str:
        """Why a run that applied no model update in any training round failed."""
        done, rounds = self._rounds_done, self.config.rounds
        ended = "" if done == rounds else f"the runtime ended after round {done} of {rounds}; "
        if done == 0:
            return f"{ended}no training round ran; the model is unchanged since round 0"
        why = "; ".join(dict.fromkeys(self._dropped))
        return f"{ended}rounds 1 to {done} applied no model update ({why}); the model is unchanged since round 0"

    def _stop_if_budget_runs_out(self, round_index: int) -> None:
        """Stops before the round whose releases could take a client past its budget."""
        plan = self.plan.privacy
        if plan.budget is None or round_index >= self.config.rounds:
            return
        projected = self.ledger.worst_case_after(plan.per_release_events)
        if projected > plan.budget:
            self._stop(
                BUDGET,
                round_index,
                f"{BUDGET_STOP}: another release would bring a client to epsilon {projected:.3f} "
                f"> {plan.budget} (delta {plan.delta:.2g}); stopped after round {round_index}",
                overrides=True,  # a spent budget outranks any other cause: such a run must never resume
            )

    @property
    def mechanism_name(self) -> str | None:
        """The release mechanism in force (None when the method releases nothing)."""
        return None if self.mechanism_class is None else self.mechanism_class.name

    def privacy_summary(self) -> dict[str, Any]:
        """The ``privacy`` object of ``summary.json``: what the worst-off client is guaranteed, and what is not covered.

        Its ``headline``, ``covers`` and ``not_covered`` are for people; ``details`` links the mode's section of
        docs/privacy.md, and ``statement`` is the long text with the run's numbers, the only copy in the file.
        """
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
            min_shares=plan.params.get("min_shares"),  # set for an aggregated mechanism only
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
        """Final checkpoint, ``summary.json`` and ``curves.png``; then the resume point records that the run ended.

        Args:
            secure_aggregation: The runtime's account of how updates were
                aggregated (``summary.json``'s ``secure_aggregation``).
        """
        self.run_dir.save_checkpoint("final", self.server.network, self.server.centroids, self._rounds_done)
        if self.stop is None and self._rounds_done < self.config.rounds:
            # The runtime gave up (e.g. its workers were lost) without the strategy deciding to stop.
            self.stop = Stop(
                RUNTIME_ENDED, self._rounds_done, f"the runtime ended after round {self._rounds_done} of {self.config.rounds}"
            )
        ended = self.stop is None or self.stop.cause == RUNTIME_ENDED
        if ended and self._rounds_done <= len(self._dropped):  # no training round applied an update, however few ran
            self.stop = Stop(NO_UPDATES, self._rounds_done, self._nothing_applied())
        if self._last_knn is None or self._rounds_done == 0:
            self._last_knn = self.monitor(self.server.network.online.backbone)
        privacy = self.privacy_summary()
        summary = {
            "knn_accuracy": self._last_knn,
            "knn_accuracy_init": self.knn_init,
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
