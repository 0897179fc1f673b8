"""DP-SGD steps in the PLD accountant, cross-checked against Opacus' own accountants."""

import warnings

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from opacus.accountants import PRVAccountant

from mechanisms import accounting
from mechanisms.accounting import calibration_discretisation, rounding_compositions
from mechanisms.base import PrivacyEvent


def pld_epsilon(q: float, sigma: float, steps: int, delta: float, grid: float,
                relation: NeighboringRelation = NeighboringRelation.REPLACE_ONE) -> float:
    """Built straight from dp_accounting, not through accounting.py."""
    acc = pld_privacy_accountant.PLDAccountant(relation, value_discretization_interval=grid)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


def opacus_epsilon(accountant, q: float, sigma: float, steps: int, delta: float) -> float:
    accountant.history = [(sigma, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(accountant.get_epsilon(delta))


def test_poisson_gaussian_record_is_the_subsampled_gaussian_under_replace_one():
    record = accounting.poisson_gaussian_privacy_event(0.05, 1.1, count=300)
    assert record == PrivacyEvent("poisson_gaussian", {"sampling_rate": 0.05, "noise_multiplier": 1.1, "count": 300.0})
    ours = accounting.epsilon_of([record], 1e-5, discretisation=1e-3)
    assert ours == pytest.approx(pld_epsilon(0.05, 1.1, 300, 1e-5, 1e-3), rel=1e-9)
    with pytest.raises(ValueError):
        accounting.epsilon_of([accounting.poisson_gaussian_privacy_event(1.5, 1.0, count=1)], 1e-5)


@pytest.mark.parametrize("sigma,steps,delta", [(3.16, 48, 8e-5), (5.0, 24, 1e-3)])
def test_full_batch_replacement_is_opacus_add_remove_at_twice_the_sensitivity(sigma, steps, delta):
    """Without subsampling, replacing an example shifts the clipped sum by 2C: Opacus' PRV at sigma / 2 must agree."""
    ours = accounting.epsilon_of([accounting.poisson_gaussian_privacy_event(1.0, sigma, count=steps)], delta,
                                 discretisation=1e-3)
    prv = opacus_epsilon(PRVAccountant(), 1.0, sigma / 2, steps, delta)
    assert ours <= prv * 1.005
    assert ours == pytest.approx(prv, rel=0.02)


@pytest.mark.parametrize("q,sigma,steps,delta", [(0.03, 1.0, 1000, 1e-5), (0.82, 3.16, 48, 8e-5)])
def test_subsampled_replacement_costs_more_than_opacus_add_remove(q, sigma, steps, delta):
    """Opacus accounts add/remove; the same DP-SGD run is worth more epsilon under replace-one, never less."""
    ours = accounting.epsilon_of([accounting.poisson_gaussian_privacy_event(q, sigma, count=steps)], delta,
                                 discretisation=1e-3)
    add_remove = pld_epsilon(q, sigma, steps, delta, 1e-3, NeighboringRelation.ADD_OR_REMOVE_ONE)
    prv = opacus_epsilon(PRVAccountant(), q, sigma, steps, delta)
    assert add_remove == pytest.approx(prv, rel=0.02)  # the PLD machinery agrees with Opacus where both apply
    assert ours > add_remove


def test_dp_sgd_steps_do_not_shrink_the_ledger_grid_and_stay_accurate():
    """Connect-the-dots PLDs: a 1e-3 grid gives thousands of steps' epsilon to 0.1% (its wall time:
    benchmarks/accounting_cost.py)."""
    steps = 5000
    dp_sgd = [accounting.poisson_gaussian_privacy_event(0.01, 0.8, count=steps)]
    assert rounding_compositions(dp_sgd) == 0
    assert calibration_discretisation(1.0, rounding_compositions(dp_sgd)) == 1e-3
    release = [PrivacyEvent("discrete_laplace", {"noise_parameter": 0.5, "sensitivity": 1.0, "count": 11.0})]
    assert rounding_compositions(dp_sgd + release) == 22  # a replacement moves two counts per query
    coarse = pld_epsilon(0.01, 0.8, steps, 1e-5, 1e-3)
    fine = pld_epsilon(0.01, 0.8, steps, 1e-5, 1e-4)
    assert fine <= coarse <= fine * 1.001


#: docs/privacy.md's table: (sampling rate, noise multiplier, steps, delta) -> (add/remove, replace-one) as printed.
DOCS_TABLE = [
    ((32 / 39, 3.165, 48, 1 / 12330), ("7.99", "19.1")),
    ((32 / 1233, 3.165, 936, 1 / 12330), ("0.83", "1.73")),
    ((0.16, 1.0, 84, 1e-5), ("10.5", "16.3")),
]


@pytest.mark.parametrize("row, printed", DOCS_TABLE)
def test_the_docs_table_of_add_remove_against_replace_one_is_what_the_accountants_say(row, printed):
    from pathlib import Path

    from mechanisms.accounting import DEFAULT_DISCRETISATION, epsilon_of, poisson_gaussian_privacy_event

    rate, sigma, steps, delta = row
    add_remove = pld_epsilon(rate, sigma, steps, delta, DEFAULT_DISCRETISATION, NeighboringRelation.ADD_OR_REMOVE_ONE)
    replace_one = epsilon_of([poisson_gaussian_privacy_event(rate, sigma, count=steps)], delta)
    assert (f"{add_remove:.{len(printed[0].split('.')[1])}f}", f"{replace_one:.{len(printed[1].split('.')[1])}f}") == printed
    docs = (Path(__file__).resolve().parents[2] / "docs" / "privacy.md").read_text()
    assert f"| {printed[0]} | {printed[1]} |" in docs
