"""The run's privacy ledger: every DP cost, per client, composed with a real accountant.

A client's *releases* and, with ``--dp-sgd``, its rounds' *training* are
charged to one replace-one unit (:mod:`mechanisms.accounting`) and compose in
one PLD, never by adding epsilons; each part's own cost is also reported.
k-anonymity is reported as k, never folded into epsilon. Sampling
amplification is credited only where an event says so (DP-SGD's Poisson
steps, ``ldp-sums``' secret sample). An epsilon is never computed at a larger
delta than any entry it composes was charged at (:meth:`PrivacyLedger.pricing_delta`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mechanisms.accounting import calibration_discretisation, epsilon_of, rounding_compositions
from mechanisms.base import Guarantee, PrivacyEvent
from privfed.durable import append_line

logger = logging.getLogger(__name__)

#: Ledger parts: everything composed, the mechanism's releases, DP-SGD training.
COMBINED = "combined"
RELEASES = "releases"
DP_SGD = "dp_sgd"
PARTS = (COMBINED, RELEASES, DP_SGD)

_EventKey = tuple[tuple[str, tuple[tuple[str, float], ...]], ...]


def merge_events(events: Iterable[PrivacyEvent]) -> tuple[PrivacyEvent, ...]:
    """Identical events folded into one with the summed ``count`` (same cost, faster PLD)."""
    counts: defaultdict[tuple[str, tuple[tuple[str, float], ...]], float] = defaultdict(float)
    for event in events:
        params = {k: v for k, v in event.params.items() if k != "count"}
        counts[(event.name, tuple(sorted(params.items())))] += float(event.params.get("count", 1.0))
    return tuple(
        PrivacyEvent(name, {**dict(params), "count": count}) for (name, params), count in sorted(counts.items())
    )


def _key(merged: tuple[PrivacyEvent, ...]) -> _EventKey:
    return tuple((e.name, tuple(sorted(e.params.items()))) for e in merged)


@lru_cache(maxsize=1024)
def _composed_epsilon(key: _EventKey, delta: float, reference_epsilon: float) -> float:
    merged = tuple(PrivacyEvent(name, dict(params)) for name, params in key)
    grid = calibration_discretisation(reference_epsilon, rounding_compositions(merged))
    return epsilon_of(merged, delta, discretisation=grid)


def composed_epsilon(events: Iterable[PrivacyEvent], delta: float, *, reference_epsilon: float = 1.0) -> float:
    """Epsilon at ``delta`` of all ``events`` composed (0 for none), cached per distinct history.

    On calibration's grid for the same release events, so a run calibrated
    to a budget is checked without rounding slack
    (:func:`mechanisms.accounting.calibration_discretisation`).
    """
    merged = merge_events(events)
    if not merged:
        return 0.0
    return _composed_epsilon(_key(merged), delta, reference_epsilon)


def check_event(event: PrivacyEvent) -> None:
    """Refuses a count that is not a positive whole number (the accountant composes ``int(count)`` times, so
    1.9 would undercharge) or a non-finite parameter."""
    count = event.params.get("count", 1)
    if not (isinstance(count, (int, float)) and count >= 1 and float(count).is_integer()):
        raise ValueError(f"privacy event {event.name!r} has count {count!r}; it must be a positive whole number")
    bad = [k for k, v in event.params.items() if not (isinstance(v, (int, float)) and math.isfinite(v))]
    if bad:
        raise ValueError(f"privacy event {event.name!r} has non-finite or non-numeric parameters {bad}")


def events_to_json(events: Iterable[PrivacyEvent]) -> str:
    """Events as a JSON list, for a client's reply (a Flower metric holds one string)."""
    return json.dumps([{"name": e.name, "params": e.params} for e in events])


def events_from_json(text: str) -> tuple[PrivacyEvent, ...]:
    """Inverse of :func:`events_to_json`."""
    return tuple(PrivacyEvent(e["name"], {k: float(v) for k, v in e["params"].items()}) for e in json.loads(text))


@dataclass(frozen=True)
class LedgerEntry:
    """One cost charged to one client in one round.

    Attributes:
        run: The Flower run it was charged in, where a ledger spans runs (a node's own).
        delta: The delta its run quoted epsilons at (None: a ledger stamps its own on an entry with events).
    """

    client: int
    round: int
    mechanism: str
    guarantee: Guarantee
    events: tuple[PrivacyEvent, ...]
    kind: str = "release"
    run: int | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("release", DP_SGD):
            raise ValueError(f"ledger entries are 'release' or 'dp_sgd', got {self.kind!r}")
        if self.delta is not None and not (isinstance(self.delta, float) and 0 < self.delta < 1):
            raise ValueError(f"a ledger entry's delta must be a float in (0, 1), got {self.delta!r}")
        for event in self.events:
            check_event(event)

    @classmethod
    def dp_sgd(
        cls, client: int, round_index: int, events: tuple[PrivacyEvent, ...], *, run: int | None = None
    ) -> LedgerEntry:
        """One client's DP-SGD training in one round (its epsilon is the ledger's to compute)."""
        guarantee = Guarantee(
            kind="differential-privacy",
            statement="DP-SGD: per-example clipped gradients with Gaussian noise on secret Poisson batches.",
        )
        return cls(client, round_index, DP_SGD, guarantee, tuple(events), kind=DP_SGD, run=run)

    @classmethod
    def from_dict(cls, values: dict) -> LedgerEntry:
        """Inverse of :meth:`to_dict`."""
        return cls(
            client=int(values["client"]),
            round=int(values["round"]),
            mechanism=str(values["mechanism"]),
            guarantee=Guarantee(**values["guarantee"]),
            events=tuple(PrivacyEvent(e["name"], {k: float(v) for k, v in e["params"].items()}) for e in values["events"]),
            kind=str(values["kind"]),
            run=None if values.get("run") is None else int(values["run"]),
            delta=None if values.get("delta") is None else float(values["delta"]),
        )

    def to_dict(self) -> dict:
        return {
            "client": self.client,
            "round": self.round,
            "kind": self.kind,
            "mechanism": self.mechanism,
            "guarantee": self.guarantee.to_dict(),
            "events": [{"name": e.name, "params": e.params} for e in self.events],
            **({} if self.run is None else {"run": self.run}),
            **({} if self.delta is None else {"delta": self.delta}),
        }


@dataclass(frozen=True)
class WorstCase:
    """The client with the largest combined epsilon (None: nothing spent), that epsilon (DP-SGD and releases
    composed), the delta all are quoted at, and the largest releases-only and DP-SGD-only epsilons of any client."""

    client: int | None
    epsilon: float
    delta: float
    releases_worst: float
    dp_sgd_worst: float


def _charge_key(entry: LedgerEntry) -> tuple[int, int, str, int | None]:
    """A client releases (or trains with DP-SGD) once per round of a run."""
    return entry.client, entry.round, entry.kind, entry.run


def _shape(entry: LedgerEntry) -> tuple[str, ...]:
    """What a charge is, up to its numbers and its guarantee's words."""
    return entry.mechanism, *(event.name for event in entry.events)


#: Relative difference below which two charges' parameters are the same charge (a recalibration's last digits).
SAME_CHARGE_TOLERANCE = 1e-9


def same_events(events: tuple[PrivacyEvent, ...], others: tuple[PrivacyEvent, ...]) -> bool:
    """Whether two charges' events are one cost: the same names and parameters, equal to :data:`SAME_CHARGE_TOLERANCE`."""
    if tuple(e.name for e in events) != tuple(e.name for e in others):
        return False
    return all(
        mine.params.keys() == theirs.params.keys()
        and all(math.isclose(v, theirs.params[k], rel_tol=SAME_CHARGE_TOLERANCE) for k, v in mine.params.items())
        for mine, theirs in zip(events, others)
    )


def _same_charge(entry: LedgerEntry, other: LedgerEntry) -> bool:
    """Whether two charges of one round are one cost: the same mechanism, events and k (the guarantee's words may
    differ: a replayed round's reply accepted, its first unanswered)."""
    return entry.mechanism == other.mechanism and entry.guarantee.k == other.guarantee.k and same_events(
        entry.events, other.events
    )


class PrivacyLedger:
    """Records every client's DP costs and answers "what has the worst-off client spent?".

    Args:
        delta: The delta this ledger's run quotes epsilons at (None: nothing is DP).
        reference_epsilon: Sets the accountant's grid.
        path: The file every recorded entry is appended to.
        legacy_delta: The delta assumed for an entry read back without one. None
            assumes ``delta``, right for a run's own ledger; a ledger that spans
            runs must assume the smallest delta any run could have had.
    """

    def __init__(
        self,
        *,
        mechanism: str | None,
        delta: float | None,
        reference_epsilon: float = 1.0,
        path: Path | None = None,
        legacy_delta: float | None = None,
    ) -> None:
        self.mechanism = mechanism
        self.delta = delta
        self.reference_epsilon = reference_epsilon
        self.path = path
        self.legacy_delta = legacy_delta
        self._entry_delta: float | None = None  # the smallest delta an entry with events was charged at
        self._events: dict[str, dict[int, list[PrivacyEvent]]] = {RELEASES: defaultdict(list), DP_SGD: defaultdict(list)}
        self._releases: Counter[int] = Counter()
        self._min_k: int | None = None
        self._epsilon_cache: dict[tuple[int, str], float] = {}
        self._last_round: dict[int, int] = {}
        self._charged: dict[tuple[int, int, str, int | None], list[LedgerEntry]] = {}

    def last_round(self, run: int) -> int | None:
        """The latest round charged in ``run`` (None: none yet)."""
        return self._last_round.get(run)

    @classmethod
    def resume(
        cls,
        path: Path | None,
        *,
        mechanism: str | None,
        delta: float | None,
        reference_epsilon: float = 1.0,
        legacy_delta: float | None = None,
    ) -> PrivacyLedger:
        """A ledger that goes on from the entries ``path`` holds, each at the delta it was written with.

        Raises:
            ValueError: a line is not a ledger entry (e.g. cut short by a crash): the spent budget is unknown.
        """
        ledger = cls(mechanism=mechanism, delta=delta, reference_epsilon=reference_epsilon, legacy_delta=legacy_delta)
        if path is not None and path.exists():
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                try:
                    ledger._add(LedgerEntry.from_dict(json.loads(line)))
                except (ValueError, KeyError, TypeError) as err:
                    raise ValueError(f"{path}, line {number}, is not a ledger entry ({err}); the spent budget is unknown") from None
        ledger.path = path
        return ledger

    def record(self, entry: LedgerEntry) -> None:
        """Adds an entry (at the ledger's delta if it has events and none), on disk before it returns.

        A second charge of the same client, round, kind and run is dropped when
        it is the same (events, parameters to :data:`SAME_CHARGE_TOLERANCE`, k:
        a resumed run replaying a killed round), refused (ValueError) for another
        mechanism or kind of noise, and otherwise counted beside the first: it
        can only raise what a round cost (up to the PLD grid's rounding, which more events make finer).
        """
        if entry.events and entry.delta is None:
            if self.delta is None:
                raise ValueError("a ledger without a delta cannot record a DP cost")
            entry = dataclasses.replace(entry, delta=float(self.delta))
        earlier = self._charged.get(_charge_key(entry), [])
        if earlier and _shape(earlier[0]) != _shape(entry):
            raise ValueError(f"client {entry.client}'s {entry.kind} of round {entry.round} was charged already, for other events")
        if not self._add(entry):
            return
        if earlier:
            logger.warning("client %d's %s of round %d was charged already, at other parameters: both charges count",
                           entry.client, entry.kind, entry.round)
        if self.path is not None:
            append_line(self.path, json.dumps(entry.to_dict()))

    def _add(self, entry: LedgerEntry) -> bool:
        """Counts ``entry`` in memory (see :meth:`record`); False when it is the same as one counted already."""
        part = DP_SGD if entry.kind == DP_SGD else RELEASES
        if part == RELEASES and entry.guarantee.k is not None:  # the smallest k of any charge stands
            self._min_k = entry.guarantee.k if self._min_k is None else min(self._min_k, entry.guarantee.k)
        charged = self._charged.setdefault(_charge_key(entry), [])
        if any(_same_charge(entry, other) for other in charged):
            return False  # a file holding one charge twice, read back, pays it once
        charged.append(entry)
        if entry.run is not None:
            self._last_round[entry.run] = max(entry.round, self._last_round.get(entry.run, entry.round))
        if part == RELEASES:
            self._releases[entry.client] += 1
        if entry.events:
            self._events[part][entry.client].extend(entry.events)
            delta = entry.delta if entry.delta is not None else self.legacy_delta or self.delta
            if delta is not None and (self._entry_delta is None or delta < self._entry_delta):
                self._entry_delta = delta
                self._epsilon_cache.clear()
            for p in (part, COMBINED):
                self._epsilon_cache.pop((entry.client, p), None)
        return True

    def pricing_delta(self, delta: float | None = None) -> float:
        """``delta`` (default the ledger's), or the smallest an entry was charged at when smaller.

        Pricing an entry at a larger delta would let a run allowing a larger
        delta spend budget the run that charged it never had.
        """
        delta = self.delta if delta is None else delta
        if delta is None:
            raise ValueError("this run has no differentially private part")
        return delta if self._entry_delta is None else min(delta, self._entry_delta)

    @property
    def is_dp(self) -> bool:
        """True when some cost is DP (the mechanism's releases, DP-SGD, or both)."""
        return self.delta is not None

    @property
    def min_k(self) -> int | None:
        return self._min_k

    def releases(self, client: int) -> int:
        return self._releases[client]

    def events(self, client: int, part: str = COMBINED) -> tuple[PrivacyEvent, ...]:
        """The events charged to ``client`` in ``part`` (one of :data:`PARTS`)."""
        if part == COMBINED:
            return (*self._events[RELEASES].get(client, ()), *self._events[DP_SGD].get(client, ()))
        if part not in PARTS:
            raise ValueError(f"unknown ledger part {part!r} (choose from {', '.join(PARTS)})")
        return tuple(self._events[part].get(client, ()))

    def spent(self, client: int, part: str = COMBINED) -> float:
        """Epsilon (at :meth:`pricing_delta`) that ``client`` has spent so far in ``part``."""
        if not self.is_dp:
            raise ValueError("this run has no differentially private part")
        if (client, part) not in self._epsilon_cache:
            self._epsilon_cache[(client, part)] = composed_epsilon(
                self.events(client, part), self.pricing_delta(), reference_epsilon=self.reference_epsilon
            )
        return self._epsilon_cache[(client, part)]

    def worst_case(self, part: str = COMBINED) -> tuple[int | None, float]:
        """The client that spent most in ``part``, and its epsilon (``(None, 0)`` before any cost)."""
        events = self._events
        clients = set(events[RELEASES]) | set(events[DP_SGD]) if part == COMBINED else set(events[part])
        if not clients:
            return None, 0.0
        client = max(clients, key=lambda c: (self.spent(c, part), -c))
        return client, self.spent(client, part)

    def worst_case_summary(self) -> WorstCase:
        """The worst-off client's combined epsilon, and each part's own worst case."""
        if not self.is_dp:
            raise ValueError("this run has no differentially private part")
        client, combined = self.worst_case(COMBINED)
        return WorstCase(
            client=client,
            epsilon=combined,
            delta=self.pricing_delta(),
            releases_worst=self.worst_case(RELEASES)[1],
            dp_sgd_worst=self.worst_case(DP_SGD)[1],
        )

    def worst_case_after(self, extra: tuple[PrivacyEvent, ...]) -> float:
        """The worst-off client's releases-only epsilon after one more release costing ``extra``.

        It drives the early stop for ``--epsilon``; DP-SGD is calibrated up front and cannot overrun.
        """
        histories: dict[_EventKey, tuple[PrivacyEvent, ...]] = {}
        for events in self._events[RELEASES].values():  # one accountant run per distinct history, not per client
            merged = merge_events(events)
            histories[_key(merged)] = merged
        return max(
            composed_epsilon([*history, *extra], self.pricing_delta(), reference_epsilon=self.reference_epsilon)
            for history in (histories.values() or [()])
        )
