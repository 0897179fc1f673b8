"""Turning the user's privacy budget into per-release mechanism parameters.

``--epsilon`` is the total (epsilon, delta) one client may spend over the
whole run. A client can be sampled in every round, so the plan assumes the
worst case of ``rounds + 1`` releases (round 0 included) and calibrates each
release so that their composition stays within the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mechanisms.base import PrivacyEvent
from mechanisms.ldp import LshCoresetMechanism, ldp_parameters
from privfed.config import TrainConfig
from privfed.errors import PrivfedError
from privfed.privacy.ledger import composed_epsilon

DP_MECHANISMS = ("ldp",)


def default_delta(client_sizes: list[int]) -> float:
    """``1 / (10 n)`` for the largest client: below 1/n for every client, as DP practice asks."""
    return 1.0 / (10 * max(max(client_sizes), 1))


@dataclass(frozen=True)
class PrivacyPlan:
    """How the run will spend its budget.

    Attributes:
        mechanism: Mechanism name.
        params: Keyword arguments every client builds the mechanism with.
        delta: The delta all epsilons are quoted at (None if not DP).
        budget: Total epsilon per client the user allowed (None: no cap).
        max_releases: Releases one client can make in the worst case.
        planned_epsilon: Epsilon a client sampled in every round would spend.
        per_release_events: What one release costs (for the ledger's look-ahead).
        fitting_releases: Releases one client can make within the budget.
    """

    mechanism: str
    params: dict[str, Any] = field(default_factory=dict)
    delta: float | None = None
    budget: float | None = None
    max_releases: int = 0
    planned_epsilon: float | None = None
    per_release_events: tuple[PrivacyEvent, ...] = ()
    fitting_releases: int | None = None

    @property
    def may_stop_early(self) -> bool:
        """True when a client sampled in every round would run out before the last round."""
        return self.fitting_releases is not None and self.fitting_releases < self.max_releases

    @property
    def is_dp(self) -> bool:
        return self.delta is not None


def plan_privacy(config: TrainConfig, client_sizes: list[int]) -> PrivacyPlan:
    """Calibrates the mechanism to the budget, or refuses a run that cannot fit it.

    Raises:
        PrivfedError: when the options are inconsistent or a fixed per-release
            epsilon would exceed the total budget (the message says what fits).
    """
    releases = config.rounds + 1  # worst case: sampled in every round, round 0 included
    if config.mechanism not in DP_MECHANISMS:
        if config.epsilon is not None or config.epsilon_per_release is not None:
            raise PrivfedError(f"--epsilon applies to differentially private mechanisms ({', '.join(DP_MECHANISMS)}), not {config.mechanism}")
        return PrivacyPlan(mechanism=config.mechanism, max_releases=releases)
    if config.epsilon is None and config.epsilon_per_release is None:
        raise PrivfedError(f"mechanism {config.mechanism} needs --epsilon (total budget per client) or --epsilon-per-release")
    delta = config.delta if config.delta is not None else default_delta(client_sizes)
    if config.epsilon_per_release is None:
        params: dict[str, Any] = ldp_parameters(config.epsilon, delta, num_releases=releases)
    else:
        params = {"epsilon": config.epsilon_per_release, "delta": delta}
    mechanism = LshCoresetMechanism(**params)
    events = mechanism.privacy_events()
    reference = config.epsilon or config.epsilon_per_release
    planned = composed_epsilon(events * releases, delta, reference_epsilon=reference)
    fitting = None
    if config.epsilon is not None and planned > config.epsilon:
        fitting = max(
            (n for n in range(releases) if composed_epsilon(events * n, delta, reference_epsilon=reference) <= config.epsilon),
            default=0,
        )
        # Refuse what is certain to exceed: not even round 0 plus one training
        # round fits, or every client takes part in every round.
        if fitting < 2 or config.participation >= 1.0:
            raise PrivfedError(
                f"{releases} releases at epsilon {config.epsilon_per_release} each compose to epsilon {planned:.3f} "
                f"> budget {config.epsilon} (delta {delta:.2g}); at most {max(fitting - 1, 0)} training rounds fit "
                f"(--rounds {max(fitting - 1, 0)}), or drop --epsilon-per-release to calibrate every release to the budget"
            )
    plain = {k: float(v) if isinstance(v, float) else v for k, v in mechanism_params(mechanism).items()}
    return PrivacyPlan(
        mechanism=config.mechanism,
        params=plain,
        delta=delta,
        budget=config.epsilon,
        max_releases=releases,
        planned_epsilon=planned,
        per_release_events=events,
        fitting_releases=fitting,
    )


def mechanism_params(mechanism: LshCoresetMechanism) -> dict[str, Any]:
    """Explicit, JSON-able constructor arguments reproducing ``mechanism``'s noise."""
    return {**mechanism.noise.to_dict(), "delta": mechanism.delta, "max_depth": mechanism.max_depth}
