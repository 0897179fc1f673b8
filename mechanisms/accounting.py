"""Privacy accounting for the mechanisms' noise, on ``dp_accounting``'s PLD.

Epsilons are never added: every cost, release or DP-SGD step, is a
:class:`~mechanisms.base.PrivacyEvent` whose privacy-loss distribution (PLD)
composes with the others in one PLD (valid under adaptive composition, and
much tighter than summing). Neighbours are **replace-one** (docs/privacy.md,
"The neighbouring relation: replace-one"), which doubles the sensitivity:

* ``"gaussian"`` (``noise_multiplier`` = noise std / clip radius): a replaced
  representation moves a sum by up to twice the radius (both in one leaf):
  ``dp_accounting``'s ``REPLACE_ONE`` Gaussian;
* ``"discrete_laplace"`` (``sensitivity``: a positive integer, how much one
  example moves one count): a replacement moves two disjoint counts (one
  down, one up) by at most that each: two compositions of the add/remove
  mechanism, the exact PLD of that worst case. A count query of another shape
  must declare the replacement's sensitivity itself;
* ``"poisson_gaussian"`` (DP-SGD steps): ``dp_accounting``'s Poisson-subsampled
  Gaussian under ``REPLACE_ONE``.

Approximation, stated once: the ``ldp`` leaf sums use the *discrete* Gaussian
on an integer grid but are accounted as a continuous Gaussian of multiplier
``sigma / sensitivity`` (grid units). Canonne, Kamath and Steinke (2020, Thm.
14-15): the multivariate discrete Gaussian meets the continuous one's
concentrated-DP bound up to an additive term below ``d * 10 * exp(-pi^2
sigma^2)`` in the Renyi divergences, far below double precision at sigma of
hundreds of grid units. That the discrete Gaussian's PLD is dominated by the
continuous one is not proven: the reported epsilon is exact to within that
negligible gap, not a theorem.

Calibration is conservative three ways: the PLD's pessimistic discretisation
rounds every loss up (check a calibration on a grid at least as fine as
:func:`calibration_discretisation`'s), the samplers round noise *up*
(:mod:`mechanisms.noise`), and the search keeps the side of the root whose
epsilon is at most the target.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from functools import lru_cache

from dp_accounting import dp_event, gaussian_mechanism, mechanism_calibration
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld.privacy_loss_distribution import (
    PrivacyLossDistribution,
    from_discrete_laplace_mechanism,
    from_gaussian_mechanism,
)
from dp_accounting.privacy_accountant import NeighboringRelation

from mechanisms.base import PrivacyEvent

#: privfed's neighbouring relation (see the module docstring).
NEIGHBOURING_RELATION = NeighboringRelation.REPLACE_ONE
#: Counts a replaced representation moves per count query (one down, one up).
REPLACED_COUNTS = 2
#: How far a replacement moves a sum, in units of one representation's largest contribution.
REPLACEMENT_SHIFT = 2.0
#: The ledger's event families, as :func:`replace_one_pld` reads them.
EVENT_NAMES = ("discrete_laplace", "gaussian", "poisson_gaussian")
#: Coarsest PLD grid used while calibrating; the rounding up to it can add up over compositions, so
#: :func:`calibration_discretisation` shrinks it until ``compositions * interval`` is at most 1% of epsilon.
MAX_CALIBRATION_DISCRETISATION = 1e-3
#: The PLD grid where a caller names none: fine for a handful of compositions at epsilon near 1.
DEFAULT_DISCRETISATION = 1e-4


@dataclass(frozen=True)
class BudgetSplit:
    """How one release's budget is shared between its three noisy parts: the *ratio* of their noise scales
    (:func:`calibrate`). The leaf sums get most, theirs being the only noise that grows with the dimension;
    tree counts spread theirs over ``max_depth + 1`` levels; leaf counts only set weights and divisors."""

    tree_counts: float = 0.25
    leaf_counts: float = 0.15
    leaf_sums: float = 0.60

    def __post_init__(self) -> None:
        parts = (self.tree_counts, self.leaf_counts, self.leaf_sums)
        if min(parts) <= 0 or abs(sum(parts) - 1.0) > 1e-9:
            raise ValueError(f"budget fractions must be positive and sum to 1, got {parts}")


@dataclass(frozen=True)
class NoiseParameters:
    """Per-release noise of the ``ldp`` mechanism, in the accountant's terms.

    Attributes:
        tree_count_parameter: Discrete-Laplace decay ``a`` (pmf proportional to ``exp(-a|k|)``) of each
            tree-node count; a replacement moves at most two counts per level, by one each.
        leaf_count_parameter: The same for the leaf counts (two move, by one each).
        sum_noise_multiplier: Gaussian std of the leaf sums over the clip radius; a replacement moves them by up
            to twice the radius.
    """

    tree_count_parameter: float
    leaf_count_parameter: float
    sum_noise_multiplier: float

    def __post_init__(self) -> None:
        values = (self.tree_count_parameter, self.leaf_count_parameter, self.sum_noise_multiplier)
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise ValueError(f"noise parameters must be positive and finite, got {self}")

    def scaled(self, factor: float) -> NoiseParameters:
        """All noise multiplied by ``factor`` (> 1 means more noise)."""
        return NoiseParameters(
            tree_count_parameter=self.tree_count_parameter / factor,
            leaf_count_parameter=self.leaf_count_parameter / factor,
            sum_noise_multiplier=self.sum_noise_multiplier * factor,
        )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def compose(event: dp_event.DpEvent, count: int) -> dp_event.DpEvent:
    """``count`` (possibly adaptive) repetitions of ``event``."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return event if count == 1 else dp_event.SelfComposedDpEvent(event=event, count=count)


def discrete_laplace_event(parameter: float, *, count: int) -> dp_event.DpEvent:
    """``count`` add/remove-one discrete-Laplace counts of sensitivity 1."""
    return compose(dp_event.DiscreteLaplaceDpEvent(noise_parameter=parameter, sensitivity=1), count)


def poisson_gaussian_privacy_event(sampling_rate: float, noise_multiplier: float, *, count: int) -> PrivacyEvent:
    """The ledger record of ``count`` DP-SGD steps: Gaussian noise at ``noise_multiplier`` on Poisson samples of rate ``sampling_rate``."""
    return PrivacyEvent(
        "poisson_gaussian",
        {"sampling_rate": float(sampling_rate), "noise_multiplier": float(noise_multiplier), "count": float(count)},
    )


def smallest_fitting_multiplier(
    fits: Callable[[float], bool], guess: float, *, floor: float = 0.0, tolerance: float = 1e-3
) -> float:
    """Smallest noise multiplier, to a relative ``tolerance``, for which ``fits`` holds (at least ``floor``).

    ``fits`` must be monotone (more noise never spends more). Bisection in log
    space from ``guess``; the upper end, which always fits, is returned.
    """
    high = max(floor, guess)
    while not fits(high):
        high *= 2
    low = high / 2
    while fits(low):
        if low <= floor:
            return low
        low, high = low / 2, low
    while high / low > 1 + tolerance:
        mid = math.sqrt(low * high)
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high


def release_event(noise: NoiseParameters, *, tree_levels: int) -> dp_event.DpEvent:
    """One ``ldp`` release under replace-one, as add/remove-one DpEvents of exactly the same PLD (two of each
    count, half the sums' multiplier), since calibration's accountant takes no replace-one discrete Laplace.
    All ``tree_levels`` (``max_depth + 1``) are charged: where the tree stops depends on the data.
    """
    return dp_event.ComposedDpEvent(
        events=[
            discrete_laplace_event(noise.tree_count_parameter, count=REPLACED_COUNTS * tree_levels),
            discrete_laplace_event(noise.leaf_count_parameter, count=REPLACED_COUNTS),
            dp_event.GaussianDpEvent(noise_multiplier=noise.sum_noise_multiplier / REPLACEMENT_SHIFT),
        ]
    )


def release_privacy_events(noise: NoiseParameters, *, tree_levels: int) -> tuple[PrivacyEvent, ...]:
    """The same release as :class:`PrivacyEvent` records, for the run's ledger."""
    return (
        PrivacyEvent(
            "discrete_laplace",
            {"noise_parameter": noise.tree_count_parameter, "sensitivity": 1.0, "count": float(tree_levels)},
        ),
        PrivacyEvent("discrete_laplace", {"noise_parameter": noise.leaf_count_parameter, "sensitivity": 1.0, "count": 1.0}),
        PrivacyEvent("gaussian", {"noise_multiplier": noise.sum_noise_multiplier, "count": 1.0}),
    )


def replace_one_pld(event: PrivacyEvent, *, discretisation: float = DEFAULT_DISCRETISATION) -> PrivacyLossDistribution:
    """The PLD under replace-one of a ledger record (:data:`EVENT_NAMES`, params as the module docstring lists)."""
    count = int(event.params.get("count", 1))
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if event.name == "poisson_gaussian":
        rate = event.params["sampling_rate"]
        if not 0 < rate <= 1:
            raise ValueError(f"sampling rate must be in (0, 1], got {rate}")
        step = from_gaussian_mechanism(
            event.params["noise_multiplier"], sampling_prob=rate, value_discretization_interval=discretisation,
            neighboring_relation=NEIGHBOURING_RELATION,
        )
        return step.self_compose(count) if count > 1 else step
    if event.name == "gaussian":  # count Gaussians of multiplier z are one of z / sqrt(count)
        return from_gaussian_mechanism(
            event.params["noise_multiplier"] / math.sqrt(count), value_discretization_interval=discretisation,
            neighboring_relation=NEIGHBOURING_RELATION,
        )
    if event.name == "discrete_laplace":
        sensitivity = event.params.get("sensitivity", 1)
        if sensitivity != int(sensitivity) or sensitivity < 1:
            raise ValueError(f"a discrete-Laplace sensitivity must be a positive whole number, got {sensitivity}")
        return from_discrete_laplace_mechanism(
            event.params["noise_parameter"], sensitivity=int(sensitivity),
            value_discretization_interval=discretisation,
        ).self_compose(REPLACED_COUNTS * count)
    raise ValueError(f"unknown privacy event {event.name!r} (privfed accounts {', '.join(EVENT_NAMES)})")


def epsilon_of(events: Iterable[PrivacyEvent], delta: float, *, discretisation: float = DEFAULT_DISCRETISATION) -> float:
    """Epsilon at ``delta`` of ``events`` composed, under replace-one neighbouring (0 for none)."""
    composed: PrivacyLossDistribution | None = None
    for event in events:
        pld = replace_one_pld(event, discretisation=discretisation)
        composed = pld if composed is None else composed.compose(pld)
    return 0.0 if composed is None else float(composed.get_epsilon_for_delta(delta))


def calibration_discretisation(epsilon: float, compositions: int) -> float:
    """PLD grid fine enough that rounding costs at most 1% of ``epsilon`` over ``compositions`` release events.

    DP-SGD steps are not counted (:func:`rounding_compositions`): their "connect the dots" PLDs' error does
    not grow linearly (``tests/mechanisms/test_dp_sgd_accounting.py``), and counting them would scale the
    grid, and the accountant's time, with the steps.
    """
    return min(MAX_CALIBRATION_DISCRETISATION, 0.01 * epsilon / max(compositions, 1))


#: Event families whose PLD discretisation error does not add up per composition.
CONNECT_THE_DOTS_EVENTS = frozenset({"poisson_gaussian"})


def rounding_compositions(events: Iterable[PrivacyEvent]) -> int:
    """How many PLDs :func:`replace_one_pld` composes for ``events``, DP-SGD steps left out."""
    return int(sum(
        e.params.get("count", 1.0) * (REPLACED_COUNTS if e.name == "discrete_laplace" else 1)
        for e in events if e.name not in CONNECT_THE_DOTS_EVENTS
    ))


def _accountant_factory(discretisation: float) -> Callable[[], pld_privacy_accountant.PLDAccountant]:
    return lambda: pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretisation)


def _calibrate_decay(epsilon: float, delta: float, count: int, discretisation: float) -> float:
    """Largest discrete-Laplace decay whose ``count``-fold composition fits (epsilon, delta) under replace-one;
    the search doubles up from half the pure-DP answer (which fits even after grid rounding)."""
    pure = epsilon / (REPLACED_COUNTS * count)
    return float(
        mechanism_calibration.calibrate_dp_mechanism(
            _accountant_factory(discretisation),
            lambda a: discrete_laplace_event(a, count=REPLACED_COUNTS * count),
            epsilon,
            delta,
            bracket_interval=mechanism_calibration.LowerEndpointAndGuess(0.5 * pure, pure),
            tol=pure * 1e-3,
        )
    )


@lru_cache(maxsize=256)
def calibrate(
    epsilon: float,
    delta: float,
    *,
    num_releases: int = 1,
    tree_levels: int,
    split: BudgetSplit = BudgetSplit(),
) -> NoiseParameters:
    """Per-release noise so that ``num_releases`` ``ldp`` releases compose to at most (epsilon, delta).

    Each part's ``num_releases``-fold composition is first fitted to its share
    (:class:`BudgetSplit`; the sums analytically, Balle and Wang 2018), so by
    basic composition the whole fits; then one factor ``c <= 1`` scales all
    noise down until the PLD of all releases meets epsilon.
    """
    if epsilon <= 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got ({epsilon}, {delta})")
    if num_releases < 1 or tree_levels < 1:
        raise ValueError("num_releases and tree_levels must be >= 1")
    grid = calibration_discretisation(epsilon, (REPLACED_COUNTS * (tree_levels + 1) + 1) * num_releases)
    sum_sigma = float(gaussian_mechanism.get_sigma_gaussian(split.leaf_sums * epsilon, split.leaf_sums * delta))
    separate = NoiseParameters(
        tree_count_parameter=_calibrate_decay(
            split.tree_counts * epsilon, split.tree_counts * delta, tree_levels * num_releases, grid
        ),
        leaf_count_parameter=_calibrate_decay(
            split.leaf_counts * epsilon, split.leaf_counts * delta, num_releases, grid
        ),
        sum_noise_multiplier=REPLACEMENT_SHIFT * sum_sigma * num_releases**0.5,
    )

    def total(factor: float) -> dp_event.DpEvent:
        return compose(release_event(separate.scaled(factor), tree_levels=tree_levels), num_releases)

    def gap(factor: float) -> float:
        acc = _accountant_factory(grid)()
        acc.compose(total(factor))
        return acc.get_epsilon(delta) - epsilon

    upper = 1.0
    while gap(upper) > 0:  # PLD discretisation may cost a hair more than the shares
        upper *= 1.25
    lower = upper / 2
    while gap(lower) <= 0:
        if lower < 1e-3:
            return separate.scaled(lower)
        lower /= 2
    factor = mechanism_calibration.calibrate_dp_mechanism(
        _accountant_factory(grid),
        total,
        epsilon,
        delta,
        bracket_interval=mechanism_calibration.ExplicitBracketInterval(lower, upper),
        tol=1e-3 * upper,
    )
    return separate.scaled(float(factor))
