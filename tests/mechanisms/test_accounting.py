import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from mechanisms import accounting
from mechanisms.accounting import BudgetSplit, NoiseParameters
from mechanisms.base import PrivacyEvent


def _independent_epsilon(noise: NoiseParameters, tree_levels: int, releases: int, delta: float) -> float:
    """Builds the composed event by hand, straight from dp_accounting (not via accounting.py)."""
    one = dp_event.ComposedDpEvent(
        [
            dp_event.SelfComposedDpEvent(dp_event.DiscreteLaplaceDpEvent(noise.tree_count_parameter, 1), tree_levels),
            dp_event.DiscreteLaplaceDpEvent(noise.leaf_count_parameter, 1),
            dp_event.GaussianDpEvent(noise.sum_noise_multiplier),
        ]
    )
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-5)
    acc.compose(dp_event.SelfComposedDpEvent(one, releases))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("epsilon,delta,releases,levels", [(1.0, 1e-5, 1, 11), (4.0, 1e-5, 10, 6), (8.0, 1e-3, 3, 11)])
def test_calibrated_noise_composes_to_at_most_the_budget_and_uses_it(epsilon, delta, releases, levels):
    noise = accounting.calibrate(epsilon, delta, num_releases=releases, tree_levels=levels)
    spent = _independent_epsilon(noise, levels, releases, delta)
    assert spent <= epsilon
    assert spent >= 0.97 * epsilon  # the joint rescaling leaves little on the table


def test_more_releases_need_more_noise():
    one = accounting.calibrate(2.0, 1e-5, num_releases=1, tree_levels=6)
    ten = accounting.calibrate(2.0, 1e-5, num_releases=10, tree_levels=6)
    assert ten.sum_noise_multiplier > one.sum_noise_multiplier
    assert ten.tree_count_parameter < one.tree_count_parameter


def test_split_shifts_noise_between_parts():
    sums_heavy = accounting.calibrate(1.0, 1e-5, tree_levels=6, split=BudgetSplit(0.1, 0.1, 0.8))
    sums_light = accounting.calibrate(1.0, 1e-5, tree_levels=6, split=BudgetSplit(0.4, 0.2, 0.4))
    assert sums_heavy.sum_noise_multiplier < sums_light.sum_noise_multiplier
    with pytest.raises(ValueError):
        BudgetSplit(0.5, 0.5, 0.5)


def test_ledger_events_round_trip_to_the_same_epsilon():
    noise = NoiseParameters(tree_count_parameter=0.1, leaf_count_parameter=0.5, sum_noise_multiplier=3.0)
    records = accounting.release_privacy_events(noise, tree_levels=5)
    assert all(isinstance(r, PrivacyEvent) for r in records)
    direct = accounting.epsilon_for(accounting.release_event(noise, tree_levels=5), 1e-5)
    via_ledger = accounting.epsilon_for(accounting.to_composed_event(records), 1e-5)
    assert via_ledger == pytest.approx(direct, rel=1e-9)
    with pytest.raises(ValueError):
        accounting.to_dp_event(PrivacyEvent("laplace-ish", {}))
