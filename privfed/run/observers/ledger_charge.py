"""The round's privacy charges, in the server's ledger: every release that reached the server, then DP-SGD steps.

Two observers, since the releases are recorded (``--record-releases``) between
the two charges. Each charges what the server planned, never the client's
copy (the strategy checked every reply against the plan).
"""

from __future__ import annotations

from mechanisms.base import (
    DIFFERENTIAL_PRIVACY,
    K_ANONYMITY,
    NO_GUARANTEE,
    Guarantee,
    Mechanism,
    SecureSumMechanism,
    round_releases,
)
from privfed.orchestra.round_report import RoundReport
from privfed.privacy import PrivacyLedger
from privfed.privacy.ledger import LedgerEntry
from privfed.run.observers.base import FinishedRound, RoundObserver
from privfed.run.plan import RunPlan

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


def rejected_clients(report: RoundReport) -> list[int]:
    """Each identified client with a rejected reply this round, once, and not also among the accepted."""
    accepted = {client for client, _ in report.training_events}
    return sorted({r.client for r in report.rejected if r.client is not None} - accepted)


def maybe_answered_before_a_kill(report: RoundReport, killed_round: int | None) -> list[int]:
    """The sampled clients with no reply in ``killed_round``, the round a killed run had in progress (none in any
    other): they may have released before the kill and do not answer it again, so they are charged too."""
    if report.round != killed_round:
        return []
    answered = {c for c, _ in report.training_events} | {c for c, _ in report.releases} | set(rejected_clients(report))
    return sorted(set(report.sampled_clients) - answered)


class ChargeReleases(RoundObserver):
    """Charges every release that reached the server; adds ``min_k`` (the least k charged) to the metrics line.

    A DP mechanism's planned events are charged for a rejected reply from a client the server asked too (its
    bytes reached the server), and for a sampled client's silence in the round a killed run had in progress.
    """

    def __init__(
        self, ledger: PrivacyLedger, plan: RunPlan, mechanism: type[Mechanism] | None, *, killed_round: int | None
    ) -> None:
        self.ledger = ledger
        self.plan = plan
        self.mechanism = mechanism  # None: the method releases nothing (the server refuses releases for it)
        self.killed_round = killed_round

    def after_round(self, finished: FinishedRound) -> None:
        charged_ks = self.charge(finished.report)
        if charged_ks:
            finished.metrics["min_k"] = min(charged_ks)

    def charge(self, report: RoundReport) -> list[int]:
        """Writes the round's release charges; returns the anonymity sets charged (k-anonymous releases only)."""
        mechanism = self.mechanism
        expected = self.plan.privacy.per_release_events
        charged_ks: list[int] = []
        if mechanism is None:
            return charged_ks
        # A secure-sum mechanism's round 0 sends nothing, nor does a round the run's cadence skips.
        # Clients count an initialisation as round 0, whatever its index: so does the server.
        index = report.round if report.train else 0
        sends = round_releases(mechanism, round_index=index, release_every=self.plan.config.release_every)
        if issubclass(mechanism, SecureSumMechanism) and sends:
            # Each accepted reply's masked vector carries its share, whether or not the sum completed.
            for client, _ in report.training_events:
                self.ledger.record(LedgerEntry(client, report.round, mechanism.name, self.charged_guarantee(None), expected))
        for client, release in report.releases:
            k = release.guarantee.k if mechanism.guarantee_kind == K_ANONYMITY else None  # no k for other kinds
            if k is not None:
                charged_ks.append(k)
            self.ledger.record(LedgerEntry(client, report.round, mechanism.name, self.charged_guarantee(k), expected))
        if expected and sends:
            rejected = Guarantee(kind=mechanism.guarantee_kind, statement=REJECTED_STATEMENT)
            for client in rejected_clients(report):
                self.ledger.record(LedgerEntry(client, report.round, mechanism.name, rejected, expected))
            in_progress = Guarantee(kind=mechanism.guarantee_kind, statement=IN_PROGRESS_STATEMENT)
            for client in maybe_answered_before_a_kill(report, self.killed_round):
                self.ledger.record(LedgerEntry(client, report.round, mechanism.name, in_progress, expected))
        return charged_ks

    def charged_guarantee(self, k: int | None) -> Guarantee:
        """What the ledger records with an accepted release: the mechanism's kind, the credited ``k``, the plan's
        epsilon and delta of one release and the server's statement, none of the client's text (its guarantee
        may claim anything, and the run's privacy is read from the ledger)."""
        kind = self.mechanism.guarantee_kind if self.mechanism is not None else NO_GUARANTEE
        privacy = self.plan.privacy
        dp = kind == DIFFERENTIAL_PRIVACY
        return Guarantee(
            kind=kind,
            statement=ACCEPTED_STATEMENTS.get(kind, ACCEPTED_STATEMENTS[NO_GUARANTEE]),
            k=k,
            epsilon=privacy.epsilon_per_release if dp else None,
            delta=privacy.delta if dp else None,
        )


class ChargeTraining(RoundObserver):
    """Charges each client's DP-SGD steps as planned, after every other charge; then logs the ledger's worst case.

    Every reply counts, rejected ones and those of a halted secure aggregation too (the client trained and sent
    its update either way), and so does silence in the round a killed run had in progress.
    """

    def __init__(self, ledger: PrivacyLedger, plan: RunPlan, *, killed_round: int | None) -> None:
        self.ledger = ledger
        self.plan = plan
        self.killed_round = killed_round

    def after_round(self, finished: FinishedRound) -> None:
        self.charge(finished.report)
        if not self.ledger.is_dp:
            return
        worst = self.ledger.worst_case_summary()
        line = finished.metrics
        line.update(privacy_epsilon=worst.epsilon, privacy_delta=worst.delta, privacy_worst_client=worst.client)
        if self.plan.privacy.dp_sgd is not None:
            line["privacy_dp_sgd_epsilon"] = worst.dp_sgd_worst
        if self.plan.privacy.is_dp:
            line["privacy_releases_epsilon"] = worst.releases_worst

    def charge(self, report: RoundReport) -> None:
        """Writes the round's DP-SGD charges (none without DP-SGD, and none in round 0)."""
        dp_sgd = self.plan.privacy.dp_sgd
        if dp_sgd is None or report.round == 0:
            return
        clients = [client for client, _ in report.training_events] + rejected_clients(report)
        for client in clients + maybe_answered_before_a_kill(report, self.killed_round):
            self.ledger.record(LedgerEntry.dp_sgd(client, report.round, dp_sgd.round_events(self.plan.client_sizes[client])))
