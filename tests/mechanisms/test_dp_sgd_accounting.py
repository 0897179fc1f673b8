"""DP-SGD steps in the PLD accountant, cross-checked against Opacus' own accountants."""

import time
import warnings

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from opacus.accountants import PRVAccountant, RDPAccountant

from mechanisms import accounting
from mechanisms.accounting import calibration_discretisation, rounding_compositions
from mechanisms.base import PrivacyEvent


def pld_epsilon(q: float, sigma: float, steps: int, delta: float, grid: float) -> float:
    """Built straight from dp_accounting, not through accounting.py."""
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=grid)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


def opacus_epsilon(accountant, q: float, sigma: float, steps: int, delta: float) -> float:
    accountant.history = [(sigma, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(accountant.get_epsilon(delta))


def test_poisson_gaussian_record_is_the_subsampled_gaussian_event():
    record = accounting.poisson_gaussian_privacy_event(0.05, 1.1, count=300)
    assert record == PrivacyEvent("poisson_gaussian", {"sampling_rate": 0.05, "noise_multiplier": 1.1, "count": 300.0})
    ours = accounting.epsilon_for(accounting.to_dp_event(record), 1e-5, discretisation=1e-3)
    assert ours == pytest.approx(pld_epsilon(0.05, 1.1, 300, 1e-5, 1e-3), rel=1e-9)
    with pytest.raises(ValueError):
        accounting.poisson_gaussian_event(1.5, 1.0)


@pytest.mark.parametrize("q,sigma,steps,delta", [(0.03, 1.0, 1000, 1e-5), (0.82, 3.16, 48, 8e-5), (1.0, 5.0, 24, 1e-3)])
def test_pld_agrees_with_opacus_prv_and_is_below_its_rdp(q, sigma, steps, delta):
    ours = accounting.epsilon_for(accounting.poisson_gaussian_event(q, sigma, count=steps), delta, discretisation=1e-3)
    prv = opacus_epsilon(PRVAccountant(), q, sigma, steps, delta)
    rdp = opacus_epsilon(RDPAccountant(), q, sigma, steps, delta)
    # PRV is Opacus' tightest accountant (an upper bound with error ~0.01); RDP is looser.
    assert ours <= prv * 1.005
    assert ours == pytest.approx(prv, rel=0.02)
    assert ours < rdp


def test_dp_sgd_steps_do_not_shrink_the_ledger_grid_and_stay_accurate():
    """Connect-the-dots PLDs: a 1e-3 grid gives thousands of steps' epsilon to 0.1%."""
    steps = 5000
    dp_sgd = [accounting.poisson_gaussian_privacy_event(0.01, 0.8, count=steps)]
    assert rounding_compositions(dp_sgd) == 0
    assert calibration_discretisation(1.0, rounding_compositions(dp_sgd)) == 1e-3
    release = [PrivacyEvent("discrete_laplace", {"noise_parameter": 0.5, "sensitivity": 1.0, "count": 11.0})]
    assert rounding_compositions(dp_sgd + release) == 11
    start = time.perf_counter()
    coarse = pld_epsilon(0.01, 0.8, steps, 1e-5, 1e-3)
    assert time.perf_counter() - start < 2.0
    fine = pld_epsilon(0.01, 0.8, steps, 1e-5, 1e-4)
    assert fine <= coarse <= fine * 1.001
