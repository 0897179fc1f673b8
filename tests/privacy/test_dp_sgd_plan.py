"""DP-SGD planning: calibration against an independent PLD, option checks, the combined plan."""

import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from scipy.stats import binom

from privfed.config import build_config
from privfed.errors import PrivfedError
from privfed.orchestra.memory_sampling import poisson_sample
from privfed.privacy.budget import default_delta, plan_privacy
from privfed.privacy.dp_sgd_plan import (
    DEFAULT_DP_SGD_EPSILON,
    MEMORY_BOUND_FAILURE,
    memory_rate,
    plan_dp_sgd,
    poisson_memory_bound,
    round_events,
)

SIZES = [7, 33, 40, 120, 250, 250, 1233]


def base(**overrides):
    return build_config(dataset="shapes:500", num_clients=3, participation=1.0, num_global_centroids=8, rounds=4, **overrides)


def independent_epsilon(n: int, sigma: float, delta: float, *, batch: int, epochs: int, rounds: int, grid: float = 1e-4) -> float:
    """A client of n examples training every round, straight from dp_accounting (replace-one) on a fine grid."""
    q = min(1.0, batch / n)
    steps = epochs * math.ceil(n / batch) * rounds
    acc = pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=grid)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


def test_calibration_keeps_every_client_size_within_the_target_and_uses_it():
    """Its wall time is benchmarks/accounting_cost.py's (no timing here: a loaded machine would fail it)."""
    plan = plan_dp_sgd(client_sizes=SIZES, delta=1e-4, max_grad_norm=1.0, batch_size=32, epochs=2, rounds=12, target_epsilon=3.0)
    spent = {n: independent_epsilon(n, plan.noise_multiplier, 1e-4, batch=32, epochs=2, rounds=12) for n in set(SIZES)}
    assert max(spent.values()) <= 3.0
    assert max(spent.values()) >= 0.99 * 3.0  # the neediest size uses (almost) all of it
    assert plan.worst_client_size == max(spent, key=spent.get)
    assert plan.planned_epsilon == pytest.approx(max(spent.values()), rel=2e-3)
    stricter = plan_dp_sgd(client_sizes=SIZES, delta=1e-4, max_grad_norm=1.0, batch_size=32, epochs=2, rounds=12, target_epsilon=1.0)
    assert stricter.noise_multiplier > plan.noise_multiplier


def test_round_events_follow_the_client_size():
    (event,) = round_events(100, batch_size=32, epochs=3, noise_multiplier=1.5)
    assert event.name == "poisson_gaussian"
    assert event.params == {"sampling_rate": 0.32, "noise_multiplier": 1.5, "count": 12.0}
    (small,) = round_events(10, batch_size=32, epochs=3, noise_multiplier=1.5)
    assert small.params["sampling_rate"] == 1.0 and small.params["count"] == 3.0


def test_dp_sgd_alone_defaults_to_epsilon_8_and_a_delta_below_one_over_n():
    plan = plan_privacy(base(dp_sgd=True), SIZES)
    assert not plan.is_dp and plan.delta is not None  # kanon releases are not DP; DP-SGD is, so the ledger has a delta
    assert plan.delta == default_delta(SIZES)
    assert plan.dp_sgd.target_epsilon == DEFAULT_DP_SGD_EPSILON
    assert plan.dp_sgd.planned_epsilon <= DEFAULT_DP_SGD_EPSILON
    assert plan.dp_sgd.rounds == 4 and plan.dp_sgd.max_grad_norm == 1.0
    assert any("DP-SGD noise multiplier" in line for line in plan.describe())


def test_a_given_noise_multiplier_is_used_as_is():
    plan = plan_privacy(base(dp_sgd=True, dp_sgd_noise_multiplier=1.3, max_grad_norm=0.5, delta=1e-5), SIZES)
    assert plan.dp_sgd.noise_multiplier == 1.3 and plan.dp_sgd.max_grad_norm == 0.5
    assert plan.dp_sgd.target_epsilon is None and plan.delta == 1e-5
    worst = max(independent_epsilon(n, 1.3, 1e-5, batch=32, epochs=2, rounds=4, grid=1e-3) for n in set(SIZES))
    assert plan.dp_sgd.planned_epsilon == pytest.approx(worst, rel=2e-3)


def test_ldp_and_dp_sgd_compose_to_less_than_the_sum_of_their_parts():
    plan = plan_privacy(base(mechanism="ldp", epsilon=2.0, dp_sgd=True, dp_sgd_epsilon=4.0), SIZES)
    assert plan.is_dp and plan.dp_sgd is not None
    combined = plan.planned_combined_epsilon
    assert max(plan.planned_epsilon, plan.dp_sgd.planned_epsilon) < combined < plan.planned_epsilon + plan.dp_sgd.planned_epsilon
    lines = [line for line in plan.describe() if "memory rows" not in line and not line.startswith("warning")]
    assert len(lines) == 3  # releases, DP-SGD, both together (besides the release floor)


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(dp_sgd=True, dp_sgd_noise_multiplier=1.0, dp_sgd_epsilon=2.0), "not both"),
        (dict(dp_sgd=True, dp_sgd_noise_multiplier=0.0), "dp_sgd_noise_multiplier must be a finite number"),
        (dict(dp_sgd=True, max_grad_norm=0.0), "max_grad_norm must be a finite number"),
        (dict(dp_sgd=True, dp_sgd_epsilon=-1.0), "dp_sgd_epsilon must be a finite number"),
        (dict(dp_sgd_epsilon=2.0), "only apply with --dp-sgd"),
        (dict(max_grad_norm=2.0), "only apply with --dp-sgd"),
        (dict(dp_sgd=True, epsilon=2.0), "use --dp-sgd-epsilon"),
    ],
)
def test_inconsistent_dp_sgd_options_are_refused_in_one_line(options, message):
    with pytest.raises(PrivfedError, match=message) as err:
        plan_privacy(base(**options), SIZES)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("size", "memory"), [(500, 50), (500, 128), (2000, 128), (50_000, 128)])
def test_the_memory_bound_is_far_below_the_clients_size(size, memory):
    """The bound a server holds a DP-SGD client's release to (it was the whole size: 500 for 500 at rate 0.1)."""
    bound = poisson_memory_bound(size, memory)
    assert memory < bound < min(size, 2 * memory)
    assert poisson_memory_bound(100, 128) == 100  # rate 1: every example, exactly


def test_the_memory_bound_is_the_binomial_tail_at_its_failure_probability():
    """The smallest m with P(size > m) <= failure: sound, and one less would not be."""
    for size, memory in [(500, 50), (300, 128), (10_000, 64)]:
        q, bound = memory_rate(size, memory), poisson_memory_bound(size, memory)
        assert binom.sf(bound, size, q) <= MEMORY_BOUND_FAILURE < binom.sf(bound - 1, size, q)


def test_the_memory_bound_holds_over_many_real_poisson_samples():
    """privfed's own Poisson sampler, 4,000 memories: a bound at failure 1% is exceeded about 1% of the time, at most."""
    size, memory, failure, trials = 500, 50, 0.01, 4000
    generator = torch.Generator().manual_seed(0)
    counts = np.array([len(poisson_sample(size, memory_rate(size, memory), generator)) for _ in range(trials)])
    bound = poisson_memory_bound(size, memory, failure)
    assert (counts > bound).mean() <= 2 * failure  # about 40 expected at most; 80 is > 6 sigma away
    assert (counts > bound - 3).mean() > failure  # and the bound is not loose
    assert (counts > poisson_memory_bound(size, memory)).sum() == 0
