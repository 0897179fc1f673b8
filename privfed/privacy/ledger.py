"""The run's privacy ledger: every release, per client, composed with a real accountant.

DP costs compose across rounds with the PLD accountant (never by adding
epsilons); k-anonymity is reported as k and never folded into epsilon. No
subsampling amplification is claimed: a client's memory is not a Poisson
sample of its data.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from mechanisms.accounting import calibration_discretisation, epsilon_for, to_composed_event
from mechanisms.base import Guarantee, PrivacyEvent


def merge_events(events: Iterable[PrivacyEvent]) -> tuple[PrivacyEvent, ...]:
    """Identical events folded into one with the summed ``count`` (same cost, faster PLD)."""
    counts: Counter[tuple[str, tuple[tuple[str, float], ...]]] = Counter()
    for event in events:
        params = {k: v for k, v in event.params.items() if k != "count"}
        counts[(event.name, tuple(sorted(params.items())))] += float(event.params.get("count", 1.0))
    return tuple(
        PrivacyEvent(name, {**dict(params), "count": count}) for (name, params), count in sorted(counts.items())
    )


def composed_epsilon(events: Iterable[PrivacyEvent], delta: float, *, reference_epsilon: float = 1.0) -> float:
    """Epsilon at ``delta`` of all ``events`` composed (0 when there are none).

    The PLD grid is the one calibration uses for the same number of
    compositions, so a run calibrated to a budget is checked against it
    without rounding slack.
    """
    merged = merge_events(events)
    if not merged:
        return 0.0
    compositions = int(sum(e.params["count"] for e in merged))
    grid = calibration_discretisation(reference_epsilon, max(compositions, 1))
    return epsilon_for(to_composed_event(merged), delta, discretisation=grid)


@dataclass(frozen=True)
class LedgerEntry:
    client: int
    round: int
    mechanism: str
    guarantee: Guarantee
    events: tuple[PrivacyEvent, ...]

    def to_dict(self) -> dict:
        return {
            "client": self.client,
            "round": self.round,
            "mechanism": self.mechanism,
            "guarantee": self.guarantee.to_dict(),
            "events": [{"name": e.name, "params": e.params} for e in self.events],
        }


class PrivacyLedger:
    """Records releases and answers "what has the worst-off client spent?"."""

    def __init__(self, *, mechanism: str, delta: float | None, reference_epsilon: float = 1.0, path: Path | None = None) -> None:
        self.mechanism = mechanism
        self.delta = delta
        self.reference_epsilon = reference_epsilon
        self.path = path
        self._events: dict[int, list[PrivacyEvent]] = defaultdict(list)
        self._releases: Counter[int] = Counter()
        self._min_k: int | None = None
        self._epsilon_cache: dict[int, float] = {}

    def record(self, entry: LedgerEntry) -> None:
        self._releases[entry.client] += 1
        if entry.events:
            self._events[entry.client].extend(entry.events)
            self._epsilon_cache.pop(entry.client, None)
        if entry.guarantee.k is not None:
            self._min_k = entry.guarantee.k if self._min_k is None else min(self._min_k, entry.guarantee.k)
        if self.path is not None:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(entry.to_dict()) + "\n")

    @property
    def is_dp(self) -> bool:
        return self.delta is not None

    @property
    def min_k(self) -> int | None:
        return self._min_k

    def releases(self, client: int) -> int:
        return self._releases[client]

    def spent(self, client: int) -> float:
        """Epsilon (at the ledger's delta) that ``client`` has spent so far."""
        if not self.is_dp:
            raise ValueError("this run's mechanism is not differentially private")
        if client not in self._epsilon_cache:
            self._epsilon_cache[client] = composed_epsilon(
                self._events.get(client, []), self.delta, reference_epsilon=self.reference_epsilon
            )
        return self._epsilon_cache[client]

    def worst_case(self) -> tuple[int | None, float]:
        """The client that spent most, and its epsilon (``(None, 0)`` before any release)."""
        if not self._events:
            return None, 0.0
        client = max(self._events, key=lambda c: (self.spent(c), -c))
        return client, self.spent(client)

    def worst_case_after(self, extra: tuple[PrivacyEvent, ...]) -> float:
        """What the worst-off client would have spent after one more release costing ``extra``."""
        histories: dict[tuple, tuple[PrivacyEvent, ...]] = {}
        for events in self._events.values():  # one accountant run per distinct history, not per client
            merged = merge_events(events)
            histories[tuple((e.name, tuple(sorted(e.params.items()))) for e in merged)] = merged
        return max(
            composed_epsilon([*history, *extra], self.delta, reference_epsilon=self.reference_epsilon)
            for history in (histories.values() or [()])
        )
