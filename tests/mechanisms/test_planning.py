"""Each mechanism plans itself: its settings, its parameters and one release's events, from one PlanRequest."""

import pytest

from mechanisms import PlanRequest, SecureSumSetup, get_mechanism_class, round_releases
from mechanisms.base import ReleaseMechanism, SecureSumMechanism

SUMS = SecureSumSetup(threshold=3, modulus=2**32, max_summed=4)


def request(**changes):
    base = dict(epsilon=5.0, delta=1e-6, num_releases=4, client_sizes=(40, 80, 120), memory_size=32, dim=16,
                num_global_centroids=8, secure_sum=SUMS)
    return PlanRequest(**{**base, **changes})


def test_a_release_mechanism_releases_in_round_0_and_a_secure_sum_one_only_in_training_rounds():
    ldp, kanon, ddp = (get_mechanism_class(name) for name in ("ldp", "kanon", "ddp-sums"))
    assert round_releases(ldp, round_index=0) and round_releases(kanon, round_index=1)
    assert not round_releases(ddp, round_index=0)
    assert round_releases(ddp, round_index=1)
    assert not round_releases(None, round_index=1)
    assert ldp.max_releases(12) == 13 and ddp.max_releases(12) == 12


@pytest.mark.parametrize("every", [1, 2, 5, 7])
def test_a_cadence_releases_in_training_rounds_1_1_plus_k_and_so_on_and_the_plan_counts_exactly_those(every):
    for mechanism in (get_mechanism_class("ldp-sums"), get_mechanism_class("ddp-sums")):
        rounds = [r for r in range(21) if round_releases(mechanism, round_index=r, release_every=every)]
        assert [r for r in rounds if r > 0] == list(range(1, 21, every))
        assert (0 in rounds) == mechanism.releases_in(train=False)
        assert mechanism.max_releases(20, release_every=every) == len(rounds)
    with pytest.raises(ValueError, match="positive integer"):
        round_releases(get_mechanism_class("kanon"), round_index=3, release_every=0)


@pytest.mark.parametrize("name", ["kanon", "ldp", "ldp-sums", "ddp-sums", "reps"])
def test_every_built_in_plan_builds_its_mechanism_and_states_its_events(name):
    cls = get_mechanism_class(name)
    plan = cls.plan(request(epsilon=5.0 if cls.is_differentially_private() else None))
    assert type(plan.mechanism) is cls and plan.mechanism.privacy_events() == plan.events
    assert bool(plan.events) == cls.is_differentially_private()
    assert isinstance(plan.mechanism, ReleaseMechanism) != isinstance(plan.mechanism, SecureSumMechanism)


def test_kanon_takes_its_min_k_from_the_settings_and_refuses_one_no_memory_holds():
    kanon = get_mechanism_class("kanon")
    assert kanon.plan(request(epsilon=None)).params == {"min_k": 5}
    assert kanon.plan(request(epsilon=None, settings={"min_k": 7})).params == {"min_k": 7}
    with pytest.raises(ValueError, match=r"no client holds min_k \(33\) images in its memory \(the most is 32\)"):
        kanon.plan(request(epsilon=None, settings={"min_k": 33}))
    with pytest.raises(ValueError, match="min_k must be at least 2"):
        kanon.plan(request(epsilon=None, settings={"min_k": 1}))


@pytest.mark.parametrize("given, message", [
    ({"secret_sample": False}, "kanon takes no setting 'secret_sample' \\(it takes: min_k\\)"),
    ({"min_k": 5.0}, "kanon's min_k must be int, got 5.0"),
    ({"min_k": True}, "kanon's min_k must be int, got True"),
])
def test_a_setting_the_class_does_not_take_or_of_another_type_is_refused(given, message):
    with pytest.raises(ValueError, match=message):
        get_mechanism_class("kanon").plan(request(epsilon=None, settings=given))


@pytest.mark.parametrize("name", ["ldp-sums", "ddp-sums"])
def test_the_secret_sample_rate_is_the_median_clients_memory_share_unless_turned_off(name):
    cls = get_mechanism_class(name)
    assert cls.plan(request()).params["sampling_rate"] == pytest.approx(32 / 80)
    assert cls.plan(request(settings={"secret_sample": False})).params["sampling_rate"] == 1.0


def test_a_secure_sum_mechanism_takes_the_sums_threshold_and_modulus_and_refuses_a_run_without_secagg():
    ddp = get_mechanism_class("ddp-sums")
    params = ddp.plan(request(epsilon=50.0)).params
    assert params["min_shares"] == 3 and params["modulus"] == 2**32
    with pytest.raises(ValueError, match="drop --no-secagg"):
        ddp.plan(request(secure_sum=None))
    with pytest.raises(ValueError, match="beyond the modulus's half"):
        ddp.plan(request(epsilon=50.0, secure_sum=SecureSumSetup(threshold=3, modulus=2**16, max_summed=4)))


def test_a_dp_plan_without_an_epsilon_is_refused():
    with pytest.raises(ValueError, match="needs an epsilon"):
        get_mechanism_class("ldp").plan(request(epsilon=None))
