"""When a run stops before its last round, and why (the causes are :mod:`privfed.run.stop`'s).

The first stop stands, except a spent privacy budget, which outranks any other: such a run must never resume.
Before the round's metrics line, in order: a round the runtime found unusable, a round no client's reply could be
used in, :data:`NO_UPDATE_LIMIT` rounds in a row without a model update, the budget. After it: Ctrl-C or SIGTERM.
At the end (:meth:`StopRules.at_end`): a runtime that gave up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from privfed.orchestra.round_report import RoundReport
from privfed.privacy import PrivacyLedger
from privfed.run.interruption import StopRequest
from privfed.run.observers.base import FinishedRound, RoundObserver
from privfed.run.plan import RunPlan
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

#: Tells the progress display of an event (a ``dict`` with ``"event"``).
Emit = Callable[[dict[str, Any]], None]


class StopRules(RoundObserver):
    """Decides the run's stop; :attr:`stop` holds it (None while the run goes on)."""

    def __init__(
        self,
        plan: RunPlan,
        ledger: PrivacyLedger,
        *,
        request: StopRequest | None,
        emit: Emit,
        killed_round: int | None,
    ) -> None:
        """``killed_round`` is the round a killed run had in progress: its clients may stay silent, so no stop."""
        self.plan = plan
        self.ledger = ledger
        self.request = request
        self.emit = emit
        self.killed_round = killed_round
        self.stop: Stop | None = None
        #: Why each training round since the last applied model update dropped its update.
        self.dropped: list[str] = []

    @property
    def reason(self) -> str | None:
        """Why the run stops early, in words (None while it goes on)."""
        return None if self.stop is None else self.stop.message

    def restore(self, figures: dict[str, Any], *, round_index: int) -> None:
        """Takes up a resume point's figures: the rounds without an update so far, and its stop if no round is left."""
        self.dropped = list(figures.get("dropped_updates", []))  # resume points before the rule lack it
        stop = figures.get("stop")  # points written before it was recorded lack it
        if stop is not None and round_index >= self.plan.config.rounds:  # no round left: the run ends as it stopped
            self.stop = Stop(**stop)

    def figures(self) -> dict[str, Any]:
        """What a resume point keeps of the rules (``stop_cause`` for points read by older versions)."""
        return {
            "dropped_updates": list(self.dropped),
            "stop_cause": None if self.stop is None else self.stop.cause,
            "stop": None if self.stop is None else self.stop.to_dict(),
        }

    def after_round(self, finished: FinishedRound) -> None:
        report = finished.report
        if report.unusable is not None:
            self._stop(UNUSABLE_ROUND, report.round, report.unusable)
        self._if_no_client_trained(report)
        self._if_no_update_applies(report)
        if self.ledger.is_dp:
            self._if_budget_runs_out(report.round)

    def after_metrics(self, finished: FinishedRound) -> None:
        """Ctrl-C or SIGTERM during the round stops the run after it (unless it was the last)."""
        round_index, request = finished.report.round, self.request
        if request is not None and request.requested and round_index < self.plan.config.rounds:
            self._stop(INTERRUPTED, round_index, f"{request.reason}; stopped after round {round_index}")

    def at_end(self, rounds_done: int) -> None:
        """The stops only the end of the run shows: the runtime ended early, or every round so far dropped its update."""
        rounds = self.plan.config.rounds
        if self.stop is None and rounds_done < rounds:
            # The runtime gave up (e.g. its workers were lost) without the strategy deciding to stop.
            self.stop = Stop(RUNTIME_ENDED, rounds_done, f"the runtime ended after round {rounds_done} of {rounds}")
        ended = self.stop is None or self.stop.cause == RUNTIME_ENDED
        if ended and rounds_done <= len(self.dropped):  # no training round applied an update, however few ran
            self.stop = Stop(NO_UPDATES, rounds_done, self._nothing_applied(rounds_done))

    def _nothing_applied(self, rounds_done: int) -> str:
        """Why a run that applied no model update in any training round failed."""
        rounds = self.plan.config.rounds
        ended = "" if rounds_done == rounds else f"the runtime ended after round {rounds_done} of {rounds}; "
        if rounds_done == 0:
            return f"{ended}no training round ran; the model is unchanged since round 0"
        why = "; ".join(dict.fromkeys(self.dropped))
        span = "round 1" if rounds_done == 1 else f"rounds 1 to {rounds_done}"
        return f"{ended}{span} applied no model update ({why}); the model is unchanged since round 0"

    def _stop(self, cause: str, round_index: int, message: str, *, overrides: bool = False) -> None:
        """Records the run's stop and tells the progress display; the first stands unless this one ``overrides`` it."""
        if self.stop is None or overrides:
            self.stop = Stop(cause, round_index, message)
            self.emit({"event": "stop", "reason": message, "cause": cause})

    def _if_no_client_trained(self, report: RoundReport) -> None:
        """Stops after a round in which no sampled client's reply could be used.

        Every later round would go the same way (a setting no client can train with, replies the server rejects);
        ``--resume`` continues once the cause is fixed. Not the round a killed run had in progress: its clients may
        have answered it before the kill and so stay silent.
        """
        if report.completed > 0 or self.stop is not None or report.round == self.killed_round:
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

    def _if_no_update_applies(self, report: RoundReport) -> None:
        """Stops after :data:`NO_UPDATE_LIMIT` training rounds in a row that dropped their update (a SecAgg+ overflow,
        an implausible or halted secure sum): left to go on, it would end "done" with the model it started from."""
        if report.round == 0:
            return
        dropped = report.update_dropped if report.unusable is None else "no usable reply"  # neither applies an update
        if dropped is None:
            self.dropped = []
            return
        self.dropped.append(dropped)
        if len(self.dropped) < NO_UPDATE_LIMIT:
            return
        first = report.round - len(self.dropped) + 1
        reasons = "; ".join(dict.fromkeys(self.dropped))  # each reason once, in order
        self._stop(
            NO_UPDATES,
            report.round,
            f"rounds {first} to {report.round} applied no model update ({reasons}); the model is unchanged since "
            f"round {first - 1} and the run stops",
        )

    def _if_budget_runs_out(self, round_index: int) -> None:
        """Stops before the round whose releases could take a client past its budget."""
        privacy = self.plan.privacy
        if privacy.budget is None or round_index >= self.plan.config.rounds:
            return
        projected = self.ledger.worst_case_after(privacy.per_release_events)
        if projected > privacy.budget:
            self._stop(
                BUDGET,
                round_index,
                f"{BUDGET_STOP}: another release would bring a client to epsilon {projected:.3f} "
                f"> {privacy.budget} (delta {privacy.delta:.2g}); stopped after round {round_index}",
                overrides=True,  # a spent budget outranks any other cause: such a run must never resume
            )
