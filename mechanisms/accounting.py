"""Privacy accounting for the noise the mechanisms add, on ``dp_accounting``'s PLD.

Epsilons are never added up: every cost is a :class:`~mechanisms.base.PrivacyEvent`
record, turned into a privacy-loss distribution (PLD) and composed, which is
both correct under adaptive composition and much tighter than summing.

The neighbouring relation is **replace-one**: one example replaced by
another, the client's size unchanged (why not add/remove-one:
docs/privacy.md, "The neighbouring relation: replace-one"). The price is the
doubled sensitivity of replacement:

* ``"gaussian"`` (``noise_multiplier`` = noise std / the clip radius): a
  replaced representation moves a sum by up to twice the radius (both in
  the same leaf), accounted as ``dp_accounting``'s ``REPLACE_ONE`` Gaussian;
* ``"discrete_laplace"`` (``sensitivity``, a positive integer = how much one
  example moves one count): a replacement moves two disjoint counts (one
  down, one up) by at most that much each, so it is charged as two
  compositions of the add/remove mechanism, which is the exact PLD of that
  worst case. A mechanism whose count query does not have this shape (one
  replacement moving one count by twice its sensitivity, say) must declare
  the sensitivity of the replacement itself;
* ``"poisson_gaussian"`` (DP-SGD steps): the Poisson-subsampled Gaussian
  under ``REPLACE_ONE``, whose analysis ``dp_accounting`` implements.

Release events and DP-SGD steps compose in one PLD.

Approximation, stated once: the leaf sums of the ``ldp`` mechanism use the
*discrete* Gaussian on an integer grid, but are accounted as a continuous
Gaussian with noise multiplier ``sigma / sensitivity`` (both in grid
units). Canonne, Kamath and Steinke (2020, Thm. 14-15) show that the
multivariate discrete Gaussian satisfies the continuous Gaussian's
concentrated-DP bound up to an additive term below ``d * 10 * exp(-pi^2
sigma^2)`` in the Renyi divergences; with sigma of hundreds of grid units
that term is far below double precision. The PLD of the discrete Gaussian
is not proven to be dominated by the continuous one, so treat the reported
epsilon as exact to within that (negligible) gap rather than as a theorem.

Calibration is conservative on three counts: the PLD's pessimistic
discretisation rounds every privacy loss up (check a calibration with a grid
at least as fine as :func:`calibration_discretisation`'s, or finer), the
samplers round noise *up* (see :mod:`mechanisms.noise`), and the search
keeps the side of the root whose epsilon is at most the target.
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


#: Coarsest value-discretisation interval used while calibrating. The PLD
#: accountant rounds every loss *up* to this grid, and the rounding can add
#: up over compositions, so :func:`calibration_discretisation` shrinks it
#: until ``compositions * interval`` is at most 1% of the target epsilon.
MAX_CALIBRATION_DISCRETISATION = 1e-3
#: The PLD grid where a caller names none: fine for a handful of compositions at epsilon near 1.
DEFAULT_DISCRETISATION = 1e-4


@dataclass(frozen=True)
class BudgetSplit:
    """How one release's privacy budget is shared between its three noisy parts.

    The fractions fix the *ratio* of the noise scales: each part is first
    calibrated alone to its share of (epsilon, delta); then all scales are
    multiplied by one common factor so the composed release uses exactly the
    whole budget (PLD composition is tighter than adding the shares, so the
    shares alone would leave budget unused).

    Defaults: most of the budget goes to the leaf sums, the only part whose
    noise grows with the dimension and therefore the one that decides how
    many representations a coreset point needs before it is more signal than
    noise. Tree counts get a quarter: they are released at every level, so
    their budget is spread over ``max_depth + 1`` compositions. Leaf counts
    only set weights and the divisor of each sum, and need little.

    Attributes:
        tree_counts: Share for the noisy node counts of the prefix tree.
        leaf_counts: Share for the noisy leaf counts (coreset weights).
        leaf_sums: Share for the noisy leaf sums (coreset points).
    """

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
        tree_count_parameter: Discrete-Laplace decay ``a`` (pmf proportional
            to ``exp(-a|k|)``) added to each tree-node count; a replaced
            representation moves at most two counts per level, by one each.
        leaf_count_parameter: Discrete-Laplace decay for the leaf counts;
            at most two move, by one each (leaves are disjoint).
        sum_noise_multiplier: Gaussian standard deviation of the leaf sums
            divided by the clip radius (one representation's largest
            contribution); a replacement moves the sums by up to twice that.
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


def discrete_laplace_event(parameter: float, *, sensitivity: int = 1, count: int = 1) -> dp_event.DpEvent:
    """Discrete Laplace counts of L1 sensitivity ``sensitivity``, ``count`` times."""
    return _repeat(dp_event.DiscreteLaplaceDpEvent(noise_parameter=parameter, sensitivity=sensitivity), count)


def gaussian_event(noise_multiplier: float, *, count: int = 1) -> dp_event.DpEvent:
    """Gaussian sums with ``sigma / L2-sensitivity = noise_multiplier``, ``count`` times."""
    return _repeat(dp_event.GaussianDpEvent(noise_multiplier=noise_multiplier), count)


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

    ``fits`` must be monotone: more noise never spends more. Bisection in log
    space from ``guess``; the bracket is widened until it holds the answer,
    and its upper end, which always fits, is returned.
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


def _repeat(event: dp_event.DpEvent, count: int) -> dp_event.DpEvent:
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return event if count == 1 else dp_event.SelfComposedDpEvent(event=event, count=count)


def compose(event: dp_event.DpEvent, count: int) -> dp_event.DpEvent:
    """``count`` (possibly adaptive) repetitions of ``event``."""
    return _repeat(event, count)


def release_event(noise: NoiseParameters, *, tree_levels: int) -> dp_event.DpEvent:
    """One ``ldp`` release under replace-one, written as add/remove-one DpEvents with the same PLD.

    ``dp_accounting``'s accountants do not take discrete-Laplace events under
    replace-one, and calibration needs one accountant; the translation is
    exact: a replacement moves two counts per query (two compositions of the
    add/remove count) and a sum by twice the radius (half the multiplier).

    Args:
        noise: The release's noise parameters.
        tree_levels: How many tree levels release counts (``max_depth + 1``,
            root included). Every level is charged even if the tree stops
            early, because where it stops depends on the data.
    """
    return dp_event.ComposedDpEvent(
        events=[
            discrete_laplace_event(noise.tree_count_parameter, count=REPLACED_COUNTS * tree_levels),
            discrete_laplace_event(noise.leaf_count_parameter, count=REPLACED_COUNTS),
            gaussian_event(noise.sum_noise_multiplier / REPLACEMENT_SHIFT),
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
    """The PLD of a ledger record under replace-one neighbouring.

    Understands ``"discrete_laplace"`` (``noise_parameter``, ``sensitivity``,
    optional ``count``), ``"gaussian"`` (``noise_multiplier``, optional
    ``count``) and ``"poisson_gaussian"`` (``sampling_rate``,
    ``noise_multiplier``, optional ``count``: DP-SGD steps).
    """
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
    """PLD grid fine enough that rounding costs at most 1% of ``epsilon``.

    ``compositions`` counts the release mechanisms' events, whose pessimistic
    rounding can add up linearly (see :func:`rounding_compositions`). DP-SGD
    steps are not counted: their PLDs use the "connect the dots"
    discretisation, whose error does not grow that way (thousands of steps
    give the same epsilon to 0.1% at a grid of 1e-3 as at 1e-4, see
    ``tests/mechanisms/test_dp_sgd_accounting.py``); counting them would make
    the grid, and the accountant's time, scale with the number of steps.
    """
    return min(MAX_CALIBRATION_DISCRETISATION, 0.01 * epsilon / max(compositions, 1))


#: Event families whose PLD discretisation error does not add up per composition.
CONNECT_THE_DOTS_EVENTS = frozenset({"poisson_gaussian"})


def rounding_compositions(events: Iterable[PrivacyEvent]) -> int:
    """How many compositions of ``events`` :func:`calibration_discretisation` must budget for."""
    return int(sum(_pld_compositions(e) for e in events if e.name not in CONNECT_THE_DOTS_EVENTS))


def _pld_compositions(event: PrivacyEvent) -> float:
    """How many PLDs :func:`replace_one_pld` composes for ``event``."""
    return event.params.get("count", 1.0) * (REPLACED_COUNTS if event.name == "discrete_laplace" else 1)


def _accountant_factory(discretisation: float) -> Callable[[], pld_privacy_accountant.PLDAccountant]:
    return lambda: pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretisation)


def _calibrate_decay(epsilon: float, delta: float, count: int, discretisation: float) -> float:
    """Largest discrete-Laplace decay whose ``count``-fold composition fits (epsilon, delta) under replace-one.

    The search starts at half the pure-DP answer (which
    always fits, even after grid rounding) and doubles upwards, so the PLDs
    it builds never get much wider than the answer's.
    """
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


def _calibrate_gaussian(epsilon: float, delta: float, count: int) -> float:
    """Smallest Gaussian noise multiplier whose ``count``-fold composition fits under replace-one.

    ``count`` Gaussians of multiplier ``z`` are exactly one Gaussian of
    multiplier ``z / sqrt(count)``, whose optimal calibration is analytic
    (Balle and Wang 2018); replacement doubles the shift.
    """
    return REPLACEMENT_SHIFT * float(gaussian_mechanism.get_sigma_gaussian(epsilon, delta)) * count**0.5


@lru_cache(maxsize=256)
def calibrate(
    epsilon: float,
    delta: float,
    *,
    num_releases: int = 1,
    tree_levels: int,
    split: BudgetSplit = BudgetSplit(),
) -> NoiseParameters:
    """Noise so that ``num_releases`` ``ldp`` releases compose to at most (epsilon, delta).

    Two steps. First every part gets its share of the budget (see
    :class:`BudgetSplit`) and is calibrated alone: its ``num_releases``-fold
    composition must fit ``(share * epsilon, share * delta)``. Those three
    guarantees together imply the total by basic composition, so the PLD of
    the composed release is at most (epsilon, delta) already, usually with
    room to spare. Then one common factor ``c <= 1`` scales all noise down
    until the PLD of all ``num_releases`` releases meets epsilon.

    Args:
        epsilon: Total epsilon over all releases.
        delta: Total delta over all releases.
        num_releases: How many releases the client may make (``N``).
        tree_levels: Levels of the prefix tree that release counts.
        split: The budget fractions.

    Returns:
        Per-release noise parameters.
    """
    if epsilon <= 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got ({epsilon}, {delta})")
    if num_releases < 1 or tree_levels < 1:
        raise ValueError("num_releases and tree_levels must be >= 1")
    grid = calibration_discretisation(epsilon, (REPLACED_COUNTS * (tree_levels + 1) + 1) * num_releases)
    separate = NoiseParameters(
        tree_count_parameter=_calibrate_decay(
            split.tree_counts * epsilon, split.tree_counts * delta, tree_levels * num_releases, grid
        ),
        leaf_count_parameter=_calibrate_decay(
            split.leaf_counts * epsilon, split.leaf_counts * delta, num_releases, grid
        ),
        sum_noise_multiplier=_calibrate_gaussian(split.leaf_sums * epsilon, split.leaf_sums * delta, num_releases),
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
