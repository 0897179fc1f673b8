"""DP-SGD on clients: its schedule, its privacy events and its noise calibration (docs/architecture.md, "DP-SGD").

A round is ``local_epochs * ceil(n / batch_size)`` Poisson steps of rate
``min(1, batch_size / n)``: one ``"poisson_gaussian"`` event, fixed by the
client's public size ``n``. ``--dp-sgd-epsilon`` is what ONE client's encoder
updates may spend over the run, at the run's delta, if it trains in every
training round (round 0 does not train); the noise is the neediest client
size's, so every client stays within it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dp_accounting import gaussian_mechanism
from scipy.stats import binom

from mechanisms.accounting import (
    MAX_CALIBRATION_DISCRETISATION,
    epsilon_of,
    poisson_gaussian_privacy_event,
    smallest_fitting_multiplier,
)
from mechanisms.base import PrivacyEvent

#: ``--dp-sgd-epsilon`` when neither it nor ``--dp-sgd-noise-multiplier`` is given.
DEFAULT_DP_SGD_EPSILON = 8.0
#: The PLD calibration's grid: the ledger's for DP-SGD events (``accounting.calibration_discretisation``).
CALIBRATION_GRID = MAX_CALIBRATION_DISCRETISATION
#: A coarser grid, still a valid upper bound, to screen client sizes quickly.
SCREENING_GRID = 1e-2
#: Sizes screened below this fraction of the target need no fine check (the grids agree to well within 2%).
SCREENING_MARGIN = 0.98
#: Relative precision of the calibrated noise multiplier.
CALIBRATION_TOLERANCE = 1e-3
#: Probability that an honest client's Poisson memory outgrows :func:`poisson_memory_bound` in a round (its reply is
#: then refused). No privacy claim rests on the bound (docs/privacy.md, "Threat model"), so it is not part of delta.
MEMORY_BOUND_FAILURE = 1e-9
#: Calibration never goes below this noise (a target epsilon in the hundreds, where DP-SGD protects nothing).
MIN_NOISE_MULTIPLIER = 0.1


@dataclass(frozen=True)
class DpSgdSettings:
    """What a client needs to run DP-SGD (sent every round): noise std over ``max_grad_norm``, and the L2 bound
    each example's gradient is clipped to."""

    noise_multiplier: float
    max_grad_norm: float

    def __post_init__(self) -> None:
        if not (self.noise_multiplier > 0 and self.max_grad_norm > 0):
            raise ValueError(f"DP-SGD needs noise_multiplier > 0 and max_grad_norm > 0, got {self}")


def sampling_rate(num_samples: int, batch_size: int) -> float:
    """Poisson rate of one step: each example joins a batch with this probability."""
    if num_samples < 1 or batch_size < 1:
        raise ValueError(f"need num_samples >= 1 and batch_size >= 1, got {num_samples}, {batch_size}")
    return min(1.0, batch_size / num_samples)


def memory_rate(num_samples: int, memory_size: int) -> float:
    """Poisson rate of the memory under DP-SGD: each example joins it with this probability."""
    return min(1.0, memory_size / max(num_samples, 1))


@lru_cache(maxsize=4096)
def poisson_memory_bound(num_samples: int, memory_size: int, failure: float = MEMORY_BOUND_FAILURE) -> int:
    """The fewest rows ``m`` with P(Binomial(n, q) > m) <= ``failure``, ``q`` the memory's rate: the uncapped
    Poisson memory's size bounds a client's rows (and its release's weight) far below ``n``."""
    rate = memory_rate(num_samples, memory_size)
    if rate >= 1.0:
        return num_samples
    bound = int(binom.isf(failure, num_samples, rate))
    while bound < num_samples and binom.sf(bound, num_samples, rate) > failure:
        bound += 1
    while bound > 0 and binom.sf(bound - 1, num_samples, rate) <= failure:
        bound -= 1
    return min(bound, num_samples)


def steps_per_round(num_samples: int, *, batch_size: int, epochs: int) -> int:
    """DP-SGD steps one client takes per round: as many as epochs of fixed-size batches would."""
    return epochs * math.ceil(num_samples / batch_size)


def round_events(num_samples: int, *, batch_size: int, epochs: int, noise_multiplier: float) -> tuple[PrivacyEvent, ...]:
    """The ledger record of one client's local training in one round."""
    return (
        poisson_gaussian_privacy_event(
            sampling_rate(num_samples, batch_size),
            noise_multiplier,
            count=steps_per_round(num_samples, batch_size=batch_size, epochs=epochs),
        ),
    )


@lru_cache(maxsize=4096)
def run_epsilon(
    num_samples: int,
    noise_multiplier: float,
    delta: float,
    *,
    batch_size: int,
    epochs: int,
    rounds: int,
    grid: float = CALIBRATION_GRID,
) -> float:
    """Epsilon (PLD, replace-one) of a client of ``num_samples`` examples training ``rounds`` rounds."""
    steps = steps_per_round(num_samples, batch_size=batch_size, epochs=epochs) * rounds
    event = poisson_gaussian_privacy_event(sampling_rate(num_samples, batch_size), noise_multiplier, count=steps)
    return epsilon_of((event,), delta, discretisation=grid)


def _calibrate_one(epsilon: float, delta: float, num_samples: int, batch_size: int, epochs: int, rounds: int) -> float:
    """Smallest noise multiplier keeping one client size within ``epsilon``; the search starts from the
    unsubsampled steps' noise times the sampling rate."""

    def fits(sigma: float) -> bool:
        return run_epsilon(num_samples, sigma, delta, batch_size=batch_size, epochs=epochs, rounds=rounds) <= epsilon

    q = sampling_rate(num_samples, batch_size)
    total_steps = steps_per_round(num_samples, batch_size=batch_size, epochs=epochs) * rounds
    unamplified = float(gaussian_mechanism.get_sigma_gaussian(epsilon, delta)) * math.sqrt(total_steps)
    return smallest_fitting_multiplier(
        fits, q * unamplified, floor=MIN_NOISE_MULTIPLIER, tolerance=CALIBRATION_TOLERANCE
    )


@lru_cache(maxsize=64)
def calibrate_noise_multiplier(
    epsilon: float, delta: float, client_sizes: tuple[int, ...], *, batch_size: int, epochs: int, rounds: int
) -> float:
    """The noise multiplier keeping EVERY client size within ``epsilon`` after ``rounds`` training rounds.

    The neediest size is guessed (the largest ``q * sqrt(steps)``, as DP-SGD's
    central limit approximation orders them) and calibrated; then every size
    is checked at that noise (a coarse PLD grid screens, a fine one decides),
    and one that still exceeds ``epsilon`` raises the noise to its own calibration.
    """
    sizes = sorted({n for n in client_sizes if n > 0})
    if not sizes:
        raise ValueError("no client has data")

    def need(n: int) -> float:
        return sampling_rate(n, batch_size) * math.sqrt(steps_per_round(n, batch_size=batch_size, epochs=epochs))

    common = dict(batch_size=batch_size, epochs=epochs, rounds=rounds)
    first = max(sizes, key=need)
    sigma = _calibrate_one(epsilon, delta, first, batch_size, epochs, rounds)
    for n in sorted(sizes, key=need, reverse=True):
        if n == first or run_epsilon(n, sigma, delta, grid=SCREENING_GRID, **common) <= SCREENING_MARGIN * epsilon:
            continue
        if run_epsilon(n, sigma, delta, **common) > epsilon:
            sigma = max(sigma, _calibrate_one(epsilon, delta, n, batch_size, epochs, rounds))
    return sigma


def worst_client_size(
    noise_multiplier: float, delta: float, client_sizes: tuple[int, ...], *, batch_size: int, epochs: int, rounds: int
) -> tuple[int, float]:
    """The client size whose DP-SGD costs most over ``rounds`` rounds, and that epsilon (a coarse grid screens,
    the sizes near the top are computed on the ledger's)."""
    common = dict(batch_size=batch_size, epochs=epochs, rounds=rounds)
    sizes = sorted({n for n in client_sizes if n > 0})
    coarse = {n: run_epsilon(n, noise_multiplier, delta, grid=SCREENING_GRID, **common) for n in sizes}
    top = max(coarse.values())
    close = [n for n in sizes if coarse[n] >= SCREENING_MARGIN * top]
    fine = {n: run_epsilon(n, noise_multiplier, delta, **common) for n in close}
    worst = max(fine, key=lambda n: (fine[n], -n))
    return worst, fine[worst]


@dataclass(frozen=True)
class DpSgdPlan:
    """How the run's DP-SGD spends its budget.

    Attributes:
        delta: The delta all DP-SGD epsilons are quoted at (the run's).
        target_epsilon: The ``--dp-sgd-epsilon`` calibrated to (None: the noise multiplier was given).
        planned_epsilon: What the worst-off client (of ``worst_client_size``) spends if it trains in every round.
    """

    settings: DpSgdSettings
    delta: float
    target_epsilon: float | None
    planned_epsilon: float
    worst_client_size: int
    batch_size: int
    epochs: int
    rounds: int

    @property
    def noise_multiplier(self) -> float:
        return self.settings.noise_multiplier

    @property
    def max_grad_norm(self) -> float:
        return self.settings.max_grad_norm

    def round_events(self, num_samples: int) -> tuple[PrivacyEvent, ...]:
        """What one round of local training costs a client of ``num_samples`` examples."""
        return round_events(
            num_samples, batch_size=self.batch_size, epochs=self.epochs, noise_multiplier=self.noise_multiplier
        )

    def to_dict(self) -> dict[str, float | int | None]:
        """JSON-able summary (for ``summary.json`` and the CLI)."""
        return {
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "delta": self.delta,
            "target_epsilon": self.target_epsilon,
            "planned_epsilon": self.planned_epsilon,
            "worst_client_size": self.worst_client_size,
            "batch_size": self.batch_size,
            "local_epochs": self.epochs,
            "rounds": self.rounds,
        }


def plan_dp_sgd(
    *,
    client_sizes: list[int],
    delta: float,
    max_grad_norm: float,
    batch_size: int,
    epochs: int,
    rounds: int,
    noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
) -> DpSgdPlan:
    """Fixes DP-SGD's noise: ``noise_multiplier`` as given, or calibrated to ``target_epsilon`` (default 8)
    per client over ``rounds`` (the worst case: a client trains in all)."""
    sizes = tuple(sorted(n for n in client_sizes if n > 0))
    common = dict(batch_size=batch_size, epochs=epochs, rounds=rounds)
    if noise_multiplier is None:
        target_epsilon = DEFAULT_DP_SGD_EPSILON if target_epsilon is None else target_epsilon
        noise_multiplier = calibrate_noise_multiplier(target_epsilon, delta, sizes, **common)
    else:
        target_epsilon = None
    worst, planned = worst_client_size(noise_multiplier, delta, sizes, **common)
    return DpSgdPlan(
        settings=DpSgdSettings(noise_multiplier=float(noise_multiplier), max_grad_norm=float(max_grad_norm)),
        delta=delta,
        target_epsilon=target_epsilon,
        planned_epsilon=planned,
        worst_client_size=worst,
        **common,
    )
