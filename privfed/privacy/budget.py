"""Turning the user's privacy budgets into mechanism and DP-SGD parameters.

``--epsilon`` is the total (epsilon, delta) one client's releases may spend
over the whole run. A client can be sampled in every round, so the plan
assumes the worst case (:meth:`~mechanisms.base.Mechanism.max_releases`) and
the mechanism calibrates each release so that their composition stays within
the budget (:meth:`~mechanisms.base.Mechanism.plan`).

``--dp-sgd`` adds a second, separately calibrated part: the encoder updates'
DP-SGD noise (see :mod:`privfed.privacy.dp_sgd_plan`), for the worst case of
training in all ``rounds`` rounds. Both parts are quoted at one delta and
compose in the run's ledger; :meth:`PrivacyPlan.describe` says what the
combination will be.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from mechanisms import Mechanism, MechanismPlan, PlanRequest, SecureSumSetup, dp_mechanisms, get_mechanism_class
from mechanisms.base import PrivacyEvent
from privfed.config import DEFAULTS, TrainConfig
from privfed.errors import PrivfedError
from privfed.privacy.dp_sgd_plan import DpSgdPlan, plan_dp_sgd
from privfed.privacy.ledger import composed_epsilon
from privfed.secagg.settings import secagg_settings

#: Largest default delta, whatever the client sizes.
MAX_DEFAULT_DELTA = 1e-6


def default_delta(client_sizes: list[int]) -> float:
    """``min(1e-6, 1 / (100 n))`` for the largest client's ``n``.

    Under the example unit, delta bounds the chance that the guarantee fails
    for an example; summed over a client's ``n`` examples this stays at most
    1 %. (``1 / (10 n)``, the default before, allowed 10 % for the largest
    client.)
    """
    return min(MAX_DEFAULT_DELTA, 1.0 / (100 * max(max(client_sizes), 1)))


@dataclass(frozen=True)
class PrivacyPlan:
    """How the run will spend its budget.

    Attributes:
        mechanism: Mechanism name (None: the run's method releases nothing).
        params: Keyword arguments every client builds the mechanism with.
        delta: The delta all epsilons are quoted at (None when neither the
            mechanism nor DP-SGD is DP).
        budget: Total release epsilon per client the user allowed (None: no cap).
        max_releases: Releases one client can make in the worst case.
        planned_epsilon: Release epsilon a client sampled in every round would
            spend (None when the mechanism is not DP).
        per_release_events: What one release costs (for the ledger's look-ahead).
        epsilon_per_release: One release alone at ``delta`` (None when the
            mechanism is not DP; DP-SGD is apart): with ``--epsilon`` alone,
            what the total budget implies for each release (more than the
            budget over the releases: composition is not a plain sum); with
            ``--epsilon-per-release``, that value as calibrated.
        fitting_releases: Releases one client can make within the budget.
        dp_sgd: The DP-SGD part (None without ``--dp-sgd``).
        planned_combined_epsilon: Releases and DP-SGD composed, for the
            client size whose DP-SGD costs most, sampled in every round
            (None unless both parts are DP).
        rows_per_vector: Fewest memory rows a released vector needs to rise
            above the noise (:meth:`~mechanisms.base.Mechanism.rows_per_vector`;
            None: the mechanism names none).
        memory_rows: Rows each client's release uses: the smaller of its size
            and ``--memory-size`` (expected, under DP-SGD's Poisson memory), or
            the expected size of its secret sample.
        sampling_rate: Rate of the releases' secret Poisson sample (1: none; ``memory_rows`` are then expected sizes).
        reference_epsilon: Sets the accountant's grid, for the server's ledger and every client's alike.
    """

    mechanism: str | None
    params: dict[str, Any] = field(default_factory=dict)
    delta: float | None = None
    budget: float | None = None
    max_releases: int = 0
    planned_epsilon: float | None = None
    per_release_events: tuple[PrivacyEvent, ...] = ()
    epsilon_per_release: float | None = None
    fitting_releases: int | None = None
    dp_sgd: DpSgdPlan | None = None
    planned_combined_epsilon: float | None = None
    rows_per_vector: float | None = None
    memory_rows: tuple[int, ...] = ()
    sampling_rate: float = 1.0
    reference_epsilon: float = 1.0

    @property
    def rows_sampled(self) -> bool:
        """True when the releases use a secret sample of every image's representation."""
        return self.sampling_rate < 1

    @property
    def may_stop_early(self) -> bool:
        """True when a client sampled in every round would run out before the last round."""
        return self.fitting_releases is not None and self.fitting_releases < self.max_releases

    @property
    def is_dp(self) -> bool:
        """True when the release mechanism is differentially private (DP-SGD aside)."""
        return self.planned_epsilon is not None

    def describe(self) -> list[str]:
        """What the plan promises, one line each, for the CLI."""
        lines = []
        if self.is_dp:
            lines.append(
                f"privacy: each client's releases compose to at most epsilon {self.planned_epsilon:.3f} "
                f"(delta {self.delta:.2g}) over {self.max_releases} possible releases, "
                f"epsilon {self.epsilon_per_release:.3f} each"
            )
        if self.dp_sgd is not None:
            plan = self.dp_sgd
            target = "" if plan.target_epsilon is None else f" (calibrated to --dp-sgd-epsilon {plan.target_epsilon:g})"
            lines.append(
                f"privacy: DP-SGD noise multiplier {plan.noise_multiplier:.4g}{target}, max grad norm "
                f"{plan.max_grad_norm:g}; a client's encoder updates over {plan.rounds} training rounds cost at most "
                f"epsilon {plan.planned_epsilon:.3f} (delta {plan.delta:.2g}; largest for {plan.worst_client_size} examples)"
            )
        if self.planned_combined_epsilon is not None:
            lines.append(
                f"privacy: releases and DP-SGD together: at most epsilon {self.planned_combined_epsilon:.3f} "
                f"(delta {self.delta:.2g}) per example of a client"
            )
        if self.rows_per_vector is not None and self.memory_rows:
            below = sum(rows < self.rows_per_vector for rows in self.memory_rows)
            held = "clients' secret samples hold" if self.rows_sampled else "clients hold"
            lines.append(
                f"privacy: a released {self.mechanism} vector stands for at least {self.rows_per_vector:.0f} "
                f"{'sampled' if self.rows_sampled else 'memory'} rows; {held} {min(self.memory_rows)} to "
                f"{max(self.memory_rows)}{' (expected)' if self.rows_sampled else ''}"
            )
            if 2 * below > len(self.memory_rows):
                lines.append(
                    f"warning: {below} of {len(self.memory_rows)} clients hold fewer rows than that, so their releases "
                    "will be mostly padding (raise the epsilon, the memory size or the data per client)"
                )
        return lines


def plan_privacy(config: TrainConfig, client_sizes: list[int]) -> PrivacyPlan:
    """The mechanism's own plan for the run's budget, composed with DP-SGD's, or a refusal of a run that cannot fit.

    Raises:
        PrivfedError: when the options are inconsistent or a fixed per-release
            epsilon would exceed the total budget (the message says what fits).
    """
    check_dp_sgd_options(config)
    delta = config.delta if config.delta is not None else default_delta(client_sizes)
    dp_sgd = _plan_dp_sgd(config, client_sizes, delta)
    reference = config.epsilon or config.epsilon_per_release or 1.0
    mechanism_class = None if config.release_mechanism is None else get_mechanism_class(config.mechanism)
    _check_budget_options(config, mechanism_class)
    if mechanism_class is None:
        return PrivacyPlan(mechanism=None, delta=delta if dp_sgd else None, dp_sgd=dp_sgd, reference_epsilon=reference)
    releases = mechanism_class.max_releases(config.rounds, release_every=config.release_every)
    total = config.epsilon_per_release is None  # --epsilon alone: the budget covers every release
    try:
        mechanism_plan = mechanism_class.plan(plan_request(config, client_sizes, delta=delta, releases=releases if total else 1))
    except ValueError as err:
        raise PrivfedError(f"mechanism {config.mechanism} cannot run as planned: {err}") from None
    events = _own_events(mechanism_class, mechanism_plan)
    common = dict(
        mechanism=config.mechanism, params=mechanism_plan.params, max_releases=releases, dp_sgd=dp_sgd,
        reference_epsilon=reference, **_release_floor(mechanism_plan.mechanism, config, client_sizes),
    )
    if not mechanism_class.is_differentially_private():
        return PrivacyPlan(delta=delta if dp_sgd else None, **common)
    if not events:
        raise PrivfedError(f"mechanism {config.mechanism} claims differential privacy but its releases report no privacy events")
    planned = composed_epsilon(events * releases, delta, reference_epsilon=reference)
    combined = None
    if dp_sgd is not None:
        training = dp_sgd.round_events(dp_sgd.worst_client_size) * config.rounds
        combined = composed_epsilon([*events * releases, *training], delta, reference_epsilon=reference)
    return PrivacyPlan(
        delta=delta,
        budget=config.epsilon,
        planned_epsilon=planned,
        per_release_events=events,
        # On a grid fine for one release (the total's grid would round it up by up to 1 % of the total).
        epsilon_per_release=composed_epsilon(
            events, delta, reference_epsilon=config.epsilon_per_release or reference / releases
        ),
        fitting_releases=_fitting_releases(config, events, releases, delta, planned, reference),
        planned_combined_epsilon=combined,
        **common,
    )


def _own_events(mechanism_class: type[Mechanism], plan: MechanismPlan) -> tuple[PrivacyEvent, ...]:
    """One release's events, as the mechanism its parameters build reports them (clients charge those; see
    :class:`~privfed.privacy.client_guard.ClientGuard`); a plan that states other events, or builds another class, is refused.
    """
    built = mechanism_class(**plan.params)
    if type(built) is not mechanism_class or type(plan.mechanism) is not mechanism_class:
        raise PrivfedError(f"mechanism {mechanism_class.name}'s plan builds another mechanism")
    if built.privacy_events() != plan.events:
        raise PrivfedError(f"mechanism {mechanism_class.name}'s plan states events other than its parameters' mechanism reports")
    return plan.events


def _check_budget_options(config: TrainConfig, mechanism_class: type[Mechanism] | None) -> None:
    """Refuses ``--epsilon`` where nothing is DP to spend it, and a DP mechanism without one."""
    given = config.epsilon is not None or config.epsilon_per_release is not None
    hint = "; for DP-SGD's budget use --dp-sgd-epsilon" if config.dp_sgd else ""
    if mechanism_class is None and given:
        raise PrivfedError(f"method {config.method} releases nothing, so --epsilon and --epsilon-per-release do not apply{hint}")
    if mechanism_class is None:
        return
    if not mechanism_class.is_differentially_private() and given:
        dp = ", ".join(dp_mechanisms())
        raise PrivfedError(f"--epsilon applies to differentially private mechanisms ({dp}), not {config.mechanism}{hint}")
    if mechanism_class.is_differentially_private() and not given:
        raise PrivfedError(f"mechanism {config.mechanism} needs --epsilon (total budget per client) or --epsilon-per-release")


def plan_request(config: TrainConfig, client_sizes: list[int], *, delta: float, releases: int) -> PlanRequest:
    """What the run asks of its mechanism: the budget of ``releases`` releases, its settings, data and secure sums."""
    settings = secagg_settings(config, client_sizes)
    return PlanRequest(
        epsilon=config.epsilon if config.epsilon_per_release is None else config.epsilon_per_release,
        delta=delta,
        num_releases=releases,
        settings=config.mechanism_settings,
        client_sizes=tuple(client_sizes),
        memory_size=config.memory_size,
        dim=config.projection_dim,
        num_global_centroids=config.num_global_centroids,
        secure_sum=None if settings is None else SecureSumSetup(
            threshold=settings.reconstruction_threshold, modulus=settings.modulus_range,
            max_summed=config.clients_per_round,
        ),
    )


def _fitting_releases(
    config: TrainConfig, events: tuple[PrivacyEvent, ...], releases: int, delta: float, planned: float, reference: float
) -> int | None:
    """Releases one client can make within ``--epsilon`` (None: all of them); refuses a run certain to overrun."""
    if config.epsilon is None or planned <= config.epsilon:
        return None
    fitting = max(
        (n for n in range(releases) if composed_epsilon(events * n, delta, reference_epsilon=reference) <= config.epsilon),
        default=0,
    )
    # Refuse what is certain to exceed: not even round 0 plus one training
    # round fits, or every client takes part in every round.
    if fitting < 2 or config.participation >= 1.0:
        if config.epsilon_per_release is not None:
            each = f"at epsilon {config.epsilon_per_release} each"
            remedy = "drop --epsilon-per-release to calibrate every release to the budget"
        else:  # the mechanism's own calibration overshoots privfed's accountant
            each = f"as {config.mechanism} calibrates them"
            remedy = f"fix {config.mechanism}'s calibrate()"
        raise PrivfedError(
            f"{releases} releases {each} compose to epsilon {planned:.3f} > budget {config.epsilon} "
            f"(delta {delta:.2g}); at most {max(fitting - 1, 0)} training rounds fit "
            f"(--rounds {max(fitting - 1, 0)}), or {remedy}"
        )
    return fitting


def _release_floor(mechanism: Mechanism, config: TrainConfig, client_sizes: list[int]) -> dict[str, Any]:
    """What one release can carry: the mechanism's floor against the rows each client's memory holds."""
    # Under DP-SGD too: the Poisson memory's expected size is min(size, memory_size).
    rate = mechanism.input_sampling_rate
    rows = tuple(round(rate * size) if rate < 1 else min(config.memory_size, size) for size in client_sizes)
    floor = mechanism.rows_per_vector(
        rows=int(statistics.median(rows)), dim=config.projection_dim, num_centroids=config.num_local_centroids
    )
    return {"rows_per_vector": floor, "memory_rows": rows, "sampling_rate": rate}


def check_dp_sgd_options(config: TrainConfig) -> None:
    """Rejects DP-SGD options that contradict each other or come without ``--dp-sgd``.

    Their ranges (epsilon, noise multiplier, clipping norm) are checked once, where the configuration is built
    (:func:`privfed.config.validate`).
    """
    given = [
        name
        for name, value in (
            ("--dp-sgd-noise-multiplier", config.dp_sgd_noise_multiplier),
            ("--dp-sgd-epsilon", config.dp_sgd_epsilon),
            ("--max-grad-norm", None if config.max_grad_norm == DEFAULTS.max_grad_norm else config.max_grad_norm),
        )
        if value is not None
    ]
    if not config.dp_sgd:
        if given:
            raise PrivfedError(f"{', '.join(given)} only apply with --dp-sgd")
        return
    if config.dp_sgd_noise_multiplier is not None and config.dp_sgd_epsilon is not None:
        raise PrivfedError("give --dp-sgd-noise-multiplier or --dp-sgd-epsilon, not both")


def _plan_dp_sgd(config: TrainConfig, client_sizes: list[int], delta: float) -> DpSgdPlan | None:
    if not config.dp_sgd:
        return None
    return plan_dp_sgd(
        client_sizes=client_sizes,
        delta=delta,
        max_grad_norm=config.max_grad_norm,
        batch_size=config.batch_size,
        epochs=config.local_epochs,
        rounds=config.rounds,
        noise_multiplier=config.dp_sgd_noise_multiplier,
        target_epsilon=config.dp_sgd_epsilon,
    )
