import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld

from mechanisms import accounting
from mechanisms.accounting import BudgetSplit, NoiseParameters
from mechanisms.base import PrivacyEvent


def _independent_epsilon(noise: NoiseParameters, tree_levels: int, releases: int, delta: float) -> float:
    """The replace-one cost of ``releases`` releases, built by hand from dp_accounting's PLDs (not via accounting.py).

    A replaced representation moves two counts per count query by one each,
    and a leaf sum by twice the radius (sensitivity 2 in multiplier units).
    """
    grid = 1e-5
    tree = pld.from_discrete_laplace_mechanism(noise.tree_count_parameter, sensitivity=1, value_discretization_interval=grid)
    leaf = pld.from_discrete_laplace_mechanism(noise.leaf_count_parameter, sensitivity=1, value_discretization_interval=grid)
    sums = pld.from_gaussian_mechanism(noise.sum_noise_multiplier / releases**0.5, sensitivity=2.0,
                                       value_discretization_interval=grid)
    total = tree.self_compose(2 * tree_levels * releases).compose(leaf.self_compose(2 * releases)).compose(sums)
    return total.get_epsilon_for_delta(delta)


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


def test_ledger_events_and_the_calibration_event_give_the_same_epsilon():
    """Calibration composes add/remove DpEvents that stand for a replace-one release; the ledger composes PLDs of its records."""
    noise = NoiseParameters(tree_count_parameter=0.1, leaf_count_parameter=0.5, sum_noise_multiplier=3.0)
    records = accounting.release_privacy_events(noise, tree_levels=5)
    assert all(isinstance(r, PrivacyEvent) for r in records)
    calibration = pld_privacy_accountant.PLDAccountant(value_discretization_interval=accounting.DEFAULT_DISCRETISATION)
    for_calibration = calibration.compose(accounting.release_event(noise, tree_levels=5)).get_epsilon(1e-5)
    via_ledger = accounting.epsilon_of(records, 1e-5)
    assert via_ledger == pytest.approx(for_calibration, rel=1e-6)
    assert via_ledger == pytest.approx(_independent_epsilon(noise, 5, 1, 1e-5), rel=1e-3)
    with pytest.raises(ValueError, match="unknown privacy event"):
        accounting.epsilon_of([PrivacyEvent("laplace-ish", {})], 1e-5)


def test_replacement_costs_more_than_adding_or_removing():
    """The same noise is worth a larger epsilon under replace-one: a replacement moves two counts and twice the sum."""
    noise = NoiseParameters(tree_count_parameter=0.3, leaf_count_parameter=0.5, sum_noise_multiplier=4.0)
    records = accounting.release_privacy_events(noise, tree_levels=11)
    add_remove = pld.from_discrete_laplace_mechanism(0.3).self_compose(11).compose(
        pld.from_discrete_laplace_mechanism(0.5)).compose(pld.from_gaussian_mechanism(4.0)).get_epsilon_for_delta(1e-5)
    assert accounting.epsilon_of(records, 1e-5) > 1.5 * add_remove
