import pytest
from dp_accounting.pld import pld_privacy_accountant

from mechanisms.accounting import release_event
from mechanisms.ldp import LshCoresetMechanism
from privfed.config import build_config
from privfed.errors import PrivfedError
from privfed.privacy.budget import default_delta, plan_privacy

SIZES = [40, 120, 250]


def base(**overrides):
    return build_config(dataset="shapes:500", num_clients=3, participation=1.0, num_global_centroids=8, rounds=4, **overrides)


def test_total_budget_is_calibrated_for_every_possible_release():
    plan = plan_privacy(base(mechanism="ldp", epsilon=2.0), SIZES)
    assert plan.delta == default_delta(SIZES) == 1e-6
    assert plan.max_releases == 5
    # Independent check: compose the per-release event max_releases times in dp_accounting.
    mechanism = LshCoresetMechanism(**plan.params)
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(release_event(mechanism.noise, tree_levels=mechanism.tree_levels), plan.max_releases)
    assert accountant.get_epsilon(plan.delta) <= 2.0 * 1.005
    assert 0.9 * 2.0 <= plan.planned_epsilon <= 2.0


@pytest.mark.parametrize("rounds", [4, 20])
def test_the_plan_states_what_one_release_alone_costs(rounds):
    """Composition is sublinear: each release under a total of 2 costs more than 2 / releases alone, and less than 2."""
    plan = plan_privacy(base(mechanism="ldp", epsilon=2.0).replace(rounds=rounds), SIZES)
    mechanism = LshCoresetMechanism(**plan.params)
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-5)
    accountant.compose(release_event(mechanism.noise, tree_levels=mechanism.tree_levels), 1)
    assert plan.epsilon_per_release == pytest.approx(accountant.get_epsilon(plan.delta), rel=0.01)
    assert 2.0 / plan.max_releases < plan.epsilon_per_release < 2.0
    assert f"epsilon {plan.epsilon_per_release:.3f} each" in plan.describe()[0]
    for cap in (None, 100.0):  # a total budget as a cap does not change what one release costs
        fixed = plan_privacy(base(mechanism="ldp", epsilon_per_release=0.5, epsilon=cap), SIZES)
        assert fixed.epsilon_per_release == pytest.approx(0.5, rel=0.01)
    assert plan_privacy(base(mechanism="kanon"), SIZES).epsilon_per_release is None


@pytest.mark.parametrize("sizes,delta", [([40, 250], 1e-6), ([5000, 20_000], 5e-7), ([1], 1e-6)])
def test_default_delta_keeps_n_times_delta_at_most_one_percent(sizes, delta):
    assert default_delta(sizes) == pytest.approx(delta)
    assert max(sizes) * default_delta(sizes) <= 0.01


def test_a_run_certain_to_exceed_its_budget_is_refused_with_what_fits():
    with pytest.raises(PrivfedError, match=r"training rounds fit \(--rounds \d+\)"):
        plan_privacy(base(mechanism="ldp", epsilon=1.0, epsilon_per_release=0.5), SIZES)


def test_partial_participation_may_start_and_stop_early():
    config = base(mechanism="ldp", epsilon=1.0, epsilon_per_release=0.5).replace(participation=0.5, num_clients=4)
    plan = plan_privacy(config, [*SIZES, 60])
    assert plan.may_stop_early and 2 <= plan.fitting_releases < plan.max_releases


def test_epsilon_is_only_for_dp_mechanisms():
    with pytest.raises(PrivfedError, match="not kanon"):
        plan_privacy(base(mechanism="kanon", epsilon=1.0), SIZES)


def test_ldp_needs_a_budget():
    with pytest.raises(PrivfedError, match="needs --epsilon"):
        plan_privacy(base(mechanism="ldp"), SIZES)


def test_non_dp_plan_has_no_delta():
    plan = plan_privacy(base(mechanism="reps"), SIZES)
    assert not plan.is_dp and plan.params == {}


class OvershootingLdp(LshCoresetMechanism):
    """A plugin whose calibration ignores composition: every release gets the whole budget."""

    name = "overshooting-ldp"

    @classmethod
    def calibrate(cls, *, epsilon, delta, num_releases):
        return super().calibrate(epsilon=epsilon, delta=delta, num_releases=1)


@pytest.fixture
def overshooting(monkeypatch):
    from mechanisms import registry

    monkeypatch.setitem(registry._REGISTRY, OvershootingLdp.name, OvershootingLdp)
    return OvershootingLdp.name


def test_a_dp_plugin_is_planned_by_its_own_calibration(overshooting):
    plan = plan_privacy(base(mechanism=overshooting, epsilon_per_release=0.5), SIZES)
    assert plan.is_dp and plan.params == OvershootingLdp.calibrate(epsilon=0.5, delta=plan.delta, num_releases=1)


def test_a_plugins_calibration_is_checked_with_privfeds_own_accountant(overshooting):
    with pytest.raises(PrivfedError, match=r"as overshooting-ldp calibrates them .*fix overshooting-ldp's calibrate\(\)"):
        plan_privacy(base(mechanism=overshooting, epsilon=2.0), SIZES)


@pytest.mark.parametrize("method", ["rotpred", "orchestra-fixed-centroids"])
def test_a_method_that_releases_nothing_plans_no_release_and_takes_no_release_budget(method):
    plan = plan_privacy(base(method=method), SIZES)
    assert plan.mechanism is None and plan.max_releases == 0 and plan.per_release_events == () and not plan.is_dp
    with pytest.raises(PrivfedError, match=f"method {method} releases nothing, so --mechanism does not apply"):
        base(method=method, mechanism="ldp")  # ldp would need a budget if it ran: refused, not recorded as if used
    with pytest.raises(PrivfedError, match=f"method {method} releases nothing"):
        plan_privacy(base(method=method, epsilon=1.0), SIZES)
    with_dp_sgd = plan_privacy(base(method=method, dp_sgd=True, dp_sgd_noise_multiplier=1.0), SIZES)
    assert with_dp_sgd.dp_sgd is not None and with_dp_sgd.delta is not None and with_dp_sgd.mechanism is None


@pytest.mark.slow  # about 40 s of CPU: the accountant's grid for epsilon 1e-6 is fine
def test_a_run_whose_own_calibration_the_sampler_cannot_draw_is_refused_when_it_is_planned():
    """ldp at --epsilon 1e-6 over 21 releases needs a tree-count decay of 4e-8, below the sampler's 2**-24."""
    config = build_config(
        dataset="shapes:200", num_clients=4, participation=0.5, rounds=20, out="unused", mechanism="ldp", epsilon=1e-6
    )
    with pytest.raises(PrivfedError, match=r"tree_count_parameter: discrete-Laplace decay .* cannot be drawn"):
        plan_privacy(config, [50, 50, 50, 50])


@pytest.mark.slow  # about 40 s: two calibrations over 50 releases
@pytest.mark.parametrize(("per_release", "total"), [(0.8, 9.0), (1.0, 11.6)])
def test_the_papers_per_release_epsilon_composes_to_what_docs_privacy_md_says(per_release, total):
    """docs/privacy.md, "The paper's epsilon is per release": 50 releases at delta 1e-3."""
    config = build_config(dataset="shapes:400", num_clients=10, participation=1.0, rounds=49, mechanism="ldp",
                          epsilon_per_release=per_release, delta=1e-3, num_global_centroids=16, projection_dim=16,
                          out="unused")
    plan = plan_privacy(config, [40] * 10)
    assert plan.planned_epsilon == pytest.approx(total, rel=0.02)


@pytest.mark.parametrize(("epsilon", "warned"), [(1.0, True), (100.0, False)])
def test_the_plan_says_how_many_rows_a_dp_release_needs_and_warns_when_most_clients_hold_fewer(epsilon, warned):
    config = build_config(dataset="shapes:2000", num_clients=10, participation=0.5, rounds=20, mechanism="ldp",
                          epsilon=epsilon, num_global_centroids=16, projection_dim=16, out="unused")
    plan = plan_privacy(config, [200] * 10)
    mechanism = LshCoresetMechanism(**plan.params)
    floor = mechanism.thresholds(root_count=128, num_centroids=config.num_local_centroids, dim=16).keep
    assert plan.rows_per_vector == pytest.approx(floor) and plan.memory_rows == (128,) * 10
    lines = plan.describe()
    assert any(f"at least {floor:.0f} memory rows" in line for line in lines)
    assert any(line.startswith("warning: 10 of 10 clients") for line in lines) == warned
    assert (floor > 128) == warned


def test_kanon_names_no_release_floor():
    config = build_config(dataset="shapes:400", num_clients=10, participation=0.5, rounds=2, mechanism="kanon",
                          num_global_centroids=16, projection_dim=16, out="unused")
    plan = plan_privacy(config, [40] * 10)
    assert plan.rows_per_vector is None and not any("memory rows" in line for line in plan.describe())


def test_ldp_sums_names_its_count_threshold_as_its_release_floor():
    config = build_config(dataset="shapes:400", num_clients=10, participation=0.5, rounds=5, mechanism="ldp-sums",
                          epsilon=10.0, num_global_centroids=16, projection_dim=16, out="unused")
    plan = plan_privacy(config, [40] * 10)
    from mechanisms.ldp_sums import LdpSumsMechanism

    assert plan.rows_per_vector == pytest.approx(LdpSumsMechanism(**plan.params).threshold)
    assert any("ldp-sums vector stands for at least" in line for line in plan.describe())


@pytest.mark.parametrize("secret_sample", [True, False])
def test_ldp_sums_samples_memory_size_rows_of_the_median_client_in_secret(secret_sample):
    config = build_config(dataset="shapes:400", num_clients=3, participation=1.0, rounds=5, mechanism="ldp-sums",
                          epsilon=10.0, memory_size=32, num_global_centroids=16, projection_dim=16,
                          secret_sample=secret_sample, out="unused")
    plan = plan_privacy(config, [40, 128, 400])
    rate = plan.params["sampling_rate"]
    assert rate == (0.25 if secret_sample else 1.0)
    assert plan.per_release_events[0].name == ("poisson_gaussian" if secret_sample else "gaussian")
    assert plan.memory_rows == ((10, 32, 100) if secret_sample else (32, 32, 32))
    expected = "sampled rows; clients' secret samples hold 10 to 100 (expected)" if secret_sample else "memory rows; clients hold 32 to 32"
    assert any(expected in line for line in plan.describe())
    assert 0.98 * 10.0 <= plan.planned_epsilon <= 10.0


def test_the_secret_sample_lets_the_same_budget_buy_less_noise_per_row():
    common = dict(dataset="shapes:400", num_clients=3, participation=1.0, rounds=5, mechanism="ldp-sums",
                  epsilon=10.0, memory_size=32, num_global_centroids=16, projection_dim=16, out="unused")
    from mechanisms.ldp_sums import row_bound, sums_grid

    grid = sums_grid(16)
    std = {}
    for secret in (True, False):
        params = plan_privacy(build_config(**common, secret_sample=secret), [40, 128, 400]).params
        std[secret] = params["noise_multiplier"] * row_bound(grid, sampled=params["sampling_rate"] < 1)
    assert std[True] < 0.5 * std[False]


def test_under_dp_sgd_the_plans_memory_rows_are_the_poisson_memorys_expected_size():
    """Under DP-SGD the memory is a Poisson sample of min(1, memory_size / n): min(n, memory_size) rows expected."""
    config = build_config(dataset="shapes:2000", num_clients=4, participation=0.5, rounds=3, mechanism="ldp",
                          epsilon=10.0, dp_sgd=True, num_global_centroids=16, projection_dim=16,
                          out="unused")
    plan = plan_privacy(config, [60, 128, 300, 900])
    assert plan.dp_sgd is not None and plan.memory_rows == (60, 128, 128, 128)


def test_a_plan_whose_events_are_not_its_mechanisms_own_is_refused(tiny_config, monkeypatch):
    from mechanisms import MechanismPlan, PrivacyEvent, registry

    class CheapEvents(LshCoresetMechanism):  # states a quarter of the noise's cost; clients would charge the truth
        @classmethod
        def plan(cls, request):
            plan = super().plan(request)
            cheap = tuple(PrivacyEvent(e.name, {k: v * 4 for k, v in e.params.items()}) for e in plan.events)
            return MechanismPlan(params=plan.params, events=cheap, mechanism=plan.mechanism)

    CheapEvents.name = "cheap-events"
    monkeypatch.setitem(registry._REGISTRY, CheapEvents.name, CheapEvents)
    with pytest.raises(PrivfedError, match="plan states events other than its parameters' mechanism reports"):
        plan_privacy(tiny_config.replace(mechanism="cheap-events", epsilon=2.0), [40, 40, 40, 40])
