"""A client's own defence against a server that would weaken its privacy.

A curious server could ask for a noise multiplier of 1e-6, ``min_k = 1``,
the ``reps`` mechanism instead of ``ldp``, or sample one client again and
again. A client therefore never takes the server's word for its privacy:

- it computes its own calibration once, from the run's *declared*
  configuration (what the user declared: ``privfed train``'s options, or the
  run config of ``flwr run``; a SuperNode may tighten it with its own cap),
  and releases and trains with it; the server sends no privacy parameter,
  and a fit instruction that carries one is refused
  (:class:`privfed.federation.client.OrchestraClient`);
- it keeps its own ledger of every cost it pays (a
  :class:`~privfed.privacy.ledger.PrivacyLedger` with one client, in a file
  when the node has a state directory, so it survives restarts), charges a
  round *before* it computes anything, and refuses a round that would take it
  past its budget (:class:`ClientGuard`).

Why only the declared parameters, not any that are no weaker (PLD caps hold for a sequence fixed in advance):
docs/privacy.md, "What clients check for themselves"; what is still composed as if fixed: its "Choose the
sequence the caps compose".

Every entry is charged at the run's delta, and no cap prices an entry at a
larger delta than its own (:meth:`PrivacyLedger.pricing_delta`), so a later
run allowing a larger delta finds no room in an earlier run's entries; an
entry without a recorded delta counts at :data:`LEGACY_DELTA`.

A refused round raises :class:`RoundRefused`; Flower reports it to the server
as a failed reply and the round goes on without this client. What stays
possible for a malicious server: ``docs/privacy.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from mechanisms import get_mechanism_class, round_releases
from mechanisms.base import Guarantee, PrivacyEvent
from privfed.config import MIN_DELTA, TrainConfig
from privfed.data.federated import FederatedSplit
from privfed.durable import locked
from privfed.errors import PrivfedError
from privfed.privacy.budget import plan_privacy
from privfed.privacy.dp_sgd_plan import DpSgdSettings, round_events
from privfed.privacy.ledger import DP_SGD, RELEASES, LedgerEntry, PrivacyLedger, composed_epsilon

logger = logging.getLogger(__name__)

#: Relative slack of the budget comparisons (the client and the server compute identical floats).
TOLERANCE = 1e-9
#: The ledger's one client: the node's own data.
SELF = 0
#: The delta an entry without one is taken to have been charged at: the smallest any run accepts.
LEGACY_DELTA = MIN_DELTA


class RoundRefused(PrivfedError):
    """The client refuses a round: it departs from the declared run, or its budget is spent (named without what
    the node spent, here or in other runs, or its own cap: those stay in the node's log)."""


@dataclass(frozen=True)
class ClientBudget:
    """What one client holds the server to, computed on the client.

    Attributes:
        mechanism: The declared mechanism (None: the method releases nothing), with ``params`` its own calibration.
        release_events: What one release may cost at most (empty unless DP).
        training_events: What one round of its DP-SGD costs, for this client's size (empty without DP-SGD).
        delta: The delta every epsilon here is quoted at (None: nothing is DP).
        release_cap: Epsilon the releases may spend in total (None: not DP).
        dp_sgd_cap: Epsilon DP-SGD may spend in total, for this client's size (None: no DP-SGD).
        reference_epsilon: Sets the accountant's grid, as the server's ledger does.
        rounds: Training rounds the declared run has (round 0 aside).
        release_every: The declared cadence: which rounds release (:func:`~mechanisms.base.round_releases`).
        node_cap: ``(epsilon, delta)`` the node itself allows, releases and DP-SGD composed (None: none).
    """

    mechanism: str | None
    params: dict[str, Any]
    release_events: tuple[PrivacyEvent, ...]
    dp_sgd: DpSgdSettings | None
    training_events: tuple[PrivacyEvent, ...]
    delta: float | None
    release_cap: float | None
    dp_sgd_cap: float | None
    reference_epsilon: float
    rounds: int
    node_cap: tuple[float, float] | None = None
    release_every: int = 1

    def releases_in(self, *, round_index: int, train: bool) -> bool:
        """Whether the client releases in this round (an initialisation round counts as round 0), as it is charged."""
        mechanism = None if self.mechanism is None else get_mechanism_class(self.mechanism)
        return round_releases(mechanism, round_index=round_index if train else 0, release_every=self.release_every)


def declared_budget(
    declared: TrainConfig, num_samples: int, *, node_cap: tuple[float, float] | None = None
) -> ClientBudget:
    """The client's own calibration of the declared run (the server's :func:`plan_privacy`), for a client of
    ``num_samples`` examples; nothing the server sends in a round enters it.

    Raises:
        PrivfedError: when the declared run cannot be planned, or the node cap is not positive.
    """
    if node_cap is not None and not (node_cap[0] > 0 and 0 < node_cap[1] < 1):
        raise PrivfedError(f"a node's privacy cap needs epsilon > 0 and 0 < delta < 1, got {node_cap}")
    return _declared_budget(declared, num_samples, node_cap)


@lru_cache(maxsize=16)  # a client process plans the declared run once, not every round
def _declared_budget(declared: TrainConfig, num_samples: int, node_cap: tuple[float, float] | None) -> ClientBudget:
    plan = plan_privacy(declared, FederatedSplit.of(declared).client_sizes())
    reference = plan.reference_epsilon
    release_cap = None
    if plan.is_dp:
        assert plan.delta is not None  # a DP plan quotes its epsilons at a delta
        release_cap = plan.budget or composed_epsilon(
            plan.per_release_events * plan.max_releases, plan.delta, reference_epsilon=reference
        )
    dp_sgd = None if plan.dp_sgd is None else plan.dp_sgd.settings
    dp_sgd_cap = None
    training: tuple[PrivacyEvent, ...] = ()
    if dp_sgd is not None:
        assert plan.delta is not None  # a DP-SGD plan quotes its epsilons at a delta
        training = round_events(
            num_samples, batch_size=declared.batch_size, epochs=declared.local_epochs,
            noise_multiplier=dp_sgd.noise_multiplier,
        )
        dp_sgd_cap = composed_epsilon(training * declared.rounds, plan.delta, reference_epsilon=reference)
    return ClientBudget(
        mechanism=plan.mechanism, params=plan.params, release_events=plan.per_release_events, dp_sgd=dp_sgd,
        training_events=training, delta=plan.delta, release_cap=release_cap, dp_sgd_cap=dp_sgd_cap,
        reference_epsilon=reference, rounds=declared.rounds, node_cap=node_cap, release_every=declared.release_every,
    )


class ClientGuard:
    """Checks every round against the client's own budget and charges it to the client's own ledger, ``ledger_path``
    (None: in memory), read back and appended to under an exclusive lock so processes sharing it cannot both
    spend the same budget."""

    def __init__(self, budget: ClientBudget, ledger_path: Path | None = None) -> None:
        self.budget = budget
        self.ledger_path = ledger_path
        self.ledger = self._read()

    def admit(
        self, *, run: int, round_index: int, train: bool, unreleased: bool = False,
        on_charge: Callable[[], None] | None = None,
    ) -> None:
        """Checks the round against the budget, then charges its declared events before anything is computed.

        Charging first, a round that fails later is paid for anyway: the client may overcount, never undercount.
        A round index past the declared rounds, or not after the last one charged in the same run, is refused:
        answering one round twice lets a server difference two SecAgg+ sums that differ by this client alone.
        The exception is ``unreleased``: the caller attests that the last round charged in this run was begun
        but nothing of it left the node (:mod:`privfed.federation.reply_store`), so it is admitted again without
        a second charge. ``on_charge`` runs under the ledger's lock once the whole charge is written (the reply
        store records the round as begun there), so neither a refused round nor a kill between two of the
        round's entries leaves a record that passes for a charged one; a kill just before it makes a resume
        refuse the round, never undercount.

        Raises:
            RoundRefused: when the round is outside the run or would overrun a cap.
        """
        mechanism = self.budget.mechanism
        releasing = self.budget.releases_in(round_index=round_index, train=train)
        releases = self.budget.release_events if releasing else ()
        if not 0 <= round_index <= self.budget.rounds:
            raise RoundRefused(f"round {round_index} is outside the declared run's rounds 0 to {self.budget.rounds}")
        training = self.budget.training_events if train else ()
        self._check_node_cap_covers(train)
        with locked(None if self.ledger_path is None else self.ledger_path.with_suffix(".lock")):
            self.ledger = self._read()
            last = self.ledger.last_round(run)
            if unreleased and last == round_index:
                return  # charged when it was begun; computing it again releases it once
            if last is not None and round_index <= last:
                raise RoundRefused(f"round {round_index} of run {run} comes after round {last} was answered")
            self._check_caps(releases, training)
            # The ledger stamps each entry with its delta, the run's.
            if releasing and mechanism is not None:  # releasing implies a mechanism; the test narrows its type
                self.ledger.record(LedgerEntry(SELF, round_index, mechanism, _charged(mechanism), releases, run=run))
            if training:
                self.ledger.record(LedgerEntry.dp_sgd(SELF, round_index, training, run=run))
            if on_charge is not None:
                on_charge()

    def spent(self, part: str) -> float:
        """Epsilon the client's ledger holds for ``part`` (0 when nothing DP was charged)."""
        return self.ledger.spent(SELF, part) if self.ledger.is_dp else 0.0

    def _read(self) -> PrivacyLedger:
        budget = self.budget
        return PrivacyLedger.resume(
            self.ledger_path, mechanism=budget.mechanism, delta=budget.delta, reference_epsilon=budget.reference_epsilon,
            legacy_delta=LEGACY_DELTA,
        )

    def _check_node_cap_covers(self, train: bool) -> None:
        """Under a node cap, refuses what no per-image epsilon covers: a non-DP release, an update trained
        without DP-SGD, and any release of a run without DP-SGD (BatchNorm mixes a batch, so a release's
        epsilon is per representation, not per image)."""
        mechanism, dp_sgd = self.budget.mechanism, self.budget.dp_sgd
        if self.budget.node_cap is None:
            return
        if mechanism is not None and not get_mechanism_class(mechanism).is_differentially_private():
            raise RoundRefused("this node caps its epsilon and takes part only in differentially private releases")
        if (train or mechanism is not None) and dp_sgd is None:
            raise RoundRefused("this node caps its epsilon per image and takes part only in runs with DP-SGD")

    def _check_caps(self, releases: tuple[PrivacyEvent, ...], training: tuple[PrivacyEvent, ...]) -> None:
        """Refuses a round past a cap. The numbers stay in the node's log: its spending in other runs and its own
        cap are none of the server's business."""
        budget, ledger = self.budget, self.ledger
        caps = ((RELEASES, releases, budget.release_cap), (DP_SGD, training, budget.dp_sgd_cap))
        for part, events, cap in caps:
            if not events or cap is None:
                continue
            delta = ledger.pricing_delta(budget.delta)
            after = composed_epsilon(
                [*ledger.events(SELF, part), *events], delta, reference_epsilon=budget.reference_epsilon
            )
            if after > cap * (1 + TOLERANCE):
                logger.warning("refused: %s epsilon would reach %.4f, past %.4f (delta %.2g)", part, after, cap, delta)
                raise RoundRefused(f"this round would take the client past its declared {part.replace('_', '-')} budget")
        if budget.node_cap is not None and (releases or training):
            epsilon, node_delta = budget.node_cap
            # The new entries are charged at the run's delta.
            delta = ledger.pricing_delta(node_delta if budget.delta is None else min(node_delta, budget.delta))
            after = composed_epsilon([*ledger.events(SELF), *releases, *training], delta, reference_epsilon=epsilon)
            if after > epsilon * (1 + TOLERANCE):
                logger.warning("refused: the node's epsilon would reach %.4f at delta %.2g, past its cap %g", after, delta, epsilon)
                raise RoundRefused("this round would take the node past its own privacy cap")


def _charged(mechanism: str) -> Guarantee:
    """What the client's ledger records with a release it charged (its epsilon is the ledger's to compute)."""
    kind = get_mechanism_class(mechanism).guarantee_kind
    return Guarantee(kind=kind, statement=f"a {mechanism} release, charged by the client before it was computed")


#: Node config keys: the most the node's data may spend, releases and DP-SGD composed, over every
#: run that uses its state directory (``privacy-delta`` defaults to :data:`NODE_DEFAULT_DELTA`).
PRIVACY_EPSILON = "privacy-epsilon"
PRIVACY_DELTA = "privacy-delta"
NODE_DEFAULT_DELTA = 1e-6


def node_cap_from(node_config: dict[str, Any]) -> tuple[float, float] | None:
    """The node's own ``(privacy-epsilon, privacy-delta)``, or None when it sets no epsilon."""
    if node_config.get(PRIVACY_EPSILON) in (None, ""):
        return None
    return float(node_config[PRIVACY_EPSILON]), float(node_config.get(PRIVACY_DELTA, NODE_DEFAULT_DELTA))
