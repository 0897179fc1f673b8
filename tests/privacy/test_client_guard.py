"""A client computes its own calibration, accepts only it, and keeps a ledger that survives restarts.

Threat model: the server sends other privacy parameters (weaker, or noisier
ones chosen round by round) or samples one client beyond its budget. The
budgets below come from the declared run alone; the "server" is whatever
dict a test passes in.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from mechanisms.accounting import NoiseParameters
from mechanisms.ldp import LshCoresetMechanism
from privfed.config import build_config
from privfed.data.federated import FederatedSplit
from privfed.privacy.budget import plan_privacy
from privfed.privacy.client_guard import (
    LEGACY_DELTA,
    ClientGuard,
    RoundRefused,
    check_dp_sgd_settings,
    check_release_parameters,
    declared_budget,
)
from privfed.privacy.ledger import DP_SGD, RELEASES, composed_epsilon

SMALL = dict(dataset="shapes:200", num_clients=4, participation=0.5, rounds=2, out="unused")


def ldp_run(**changes):
    return build_config(**{**SMALL, "mechanism": "ldp", "epsilon": 1.0, **changes})


def sizes(config) -> list[int]:
    return FederatedSplit.of(config).client_sizes()


def server_params(config) -> dict:
    """What an honest server sends: its own plan of the same run."""
    return dict(plan_privacy(config, sizes(config)).params)


def admit(guard: ClientGuard, config, round_index: int, *, params=None, dp_sgd=None, train=True, run=1) -> None:
    guard.admit(
        run=run, round_index=round_index, mechanism=config.release_mechanism,
        params=server_params(config) if params is None else params, dp_sgd=dp_sgd,
        batch_size=config.batch_size, epochs=config.local_epochs, num_samples=sizes(config)[0], train=train,
    )


def noisier(params: dict, factor: float = 2.0) -> dict:
    """``params`` with every ldp noise scale multiplied by ``factor``."""
    keys = ("tree_count_parameter", "leaf_count_parameter", "sum_noise_multiplier")
    noise = NoiseParameters(**{k: params[k] for k in keys}).scaled(factor)
    return {**params, **noise.to_dict()}


def test_the_honest_servers_parameters_pass_and_noisier_ones_do_not():
    """Noisier parameters chosen round by round would make the cap a PLD filter under adaptivity, which is unproven."""
    config = ldp_run()
    budget = declared_budget(config, sizes(config)[0])
    params = server_params(config)
    assert check_release_parameters(budget, "ldp", params) == budget.release_events
    with pytest.raises(RoundRefused, match="noisier ones included"):
        check_release_parameters(budget, "ldp", noisier(params))
    # A server on another machine may compute the calibration in other last bits.
    check_release_parameters(budget, "ldp", {**params, "sum_noise_multiplier": params["sum_noise_multiplier"] * (1 + 1e-12)})


def test_eleven_releases_at_twice_the_noise_are_refused_where_three_declared_ones_fit(tmp_path):
    """The review's sequence: the declared cap alone would admit it, the client charges none of it."""
    config = ldp_run()
    budget = declared_budget(config, sizes(config)[0])
    params = noisier(server_params(config))
    eleven = LshCoresetMechanism(**params).privacy_events() * 11
    assert config.rounds + 1 == 3 and composed_epsilon(eleven, budget.delta) <= budget.release_cap  # fits the cap
    path = tmp_path / "ledger.jsonl"
    guard = ClientGuard(budget, path)
    for run in range(11):
        with pytest.raises(RoundRefused, match="not the declared"):
            admit(guard, config, 0, params=params, train=False, run=run)
    assert not path.exists() and guard.spent(RELEASES) == 0.0
    for round_index in range(config.rounds + 1):  # the declared parameters still run
        admit(guard, config, round_index, train=round_index > 0)
    assert len(path.read_text().splitlines()) == config.rounds + 1


@pytest.mark.parametrize(
    "key, weaken",
    [
        ("sum_noise_multiplier", lambda v: v / 2),
        ("tree_count_parameter", lambda v: v * 2),  # a larger decay is less noise
        ("max_depth", lambda v: v + 10),  # more tree levels released
    ],
)
def test_a_client_refuses_ldp_parameters_weaker_than_its_own_calibration(key, weaken):
    config = ldp_run()
    budget = declared_budget(config, sizes(config)[0])
    params = server_params(config)
    with pytest.raises(RoundRefused, match=f"ldp {key} .* is not the declared"):
        check_release_parameters(budget, "ldp", {**params, key: weaken(params[key])})


def test_a_client_refuses_another_mechanism_extra_parameters_and_a_smaller_anonymity_set():
    config = ldp_run()
    budget = declared_budget(config, sizes(config)[0])
    with pytest.raises(RoundRefused, match="declared mechanism ldp, the server asked for reps"):
        check_release_parameters(budget, "reps", {})
    with pytest.raises(RoundRefused, match="declared mechanism ldp, the server asked for None"):
        check_release_parameters(budget, None, {})
    with pytest.raises(RoundRefused, match="grid_resolution"):
        check_release_parameters(budget, "ldp", {**server_params(config), "grid_resolution": 10.0})
    kanon = build_config(**SMALL, mechanism="kanon")
    kanon_budget = declared_budget(kanon, sizes(kanon)[0])
    check_release_parameters(kanon_budget, "kanon", {"min_k": 5})
    for other in (1, 4, 4.5, "5", 8):  # larger sets too: only the declared parameters pass
        with pytest.raises(RoundRefused, match="min_k"):
            check_release_parameters(kanon_budget, "kanon", {"min_k": other})


def test_a_client_refuses_dp_sgd_settings_other_than_its_own_or_none_at_all():
    config = build_config(**SMALL, mechanism="kanon", dp_sgd=True)
    budget = declared_budget(config, sizes(config)[0])
    own = plan_privacy(config, sizes(config)).dp_sgd.settings
    assert budget.dp_sgd == own
    check_dp_sgd_settings(budget, own)
    for factor in (2.0, 0.5):  # more noise too
        with pytest.raises(RoundRefused, match="noise multiplier"):
            check_dp_sgd_settings(budget, dataclasses.replace(own, noise_multiplier=factor * own.noise_multiplier))
    with pytest.raises(RoundRefused, match="max grad norm"):
        check_dp_sgd_settings(budget, dataclasses.replace(own, max_grad_norm=2 * own.max_grad_norm))
    with pytest.raises(RoundRefused, match="without it"):
        check_dp_sgd_settings(budget, None)


def test_a_fractional_tree_depth_and_another_delta_are_refused():
    config = ldp_run()
    budget = declared_budget(config, sizes(config)[0])
    params = server_params(config)
    with pytest.raises(RoundRefused, match=r"max_depth 9\.5"):
        check_release_parameters(budget, "ldp", {**params, "max_depth": params["max_depth"] - 0.5})
    with pytest.raises(RoundRefused, match="delta"):
        check_release_parameters(budget, "ldp", {**params, "delta": 0.999})


def test_parameters_the_sampler_cannot_draw_are_refused_before_anything_is_charged(tmp_path):
    """Sent by the server, or (a hand-made budget) the client's own: refused, and the ledger is unchanged."""
    config = ldp_run()
    path = tmp_path / "ledger.jsonl"
    budget = declared_budget(config, sizes(config)[0])
    guard = ClientGuard(budget, path)
    undrawable = {**server_params(config), "tree_count_parameter": 1e-9}
    with pytest.raises(RoundRefused):
        admit(guard, config, 0, params=undrawable, train=False)
    own_undrawable = ClientGuard(dataclasses.replace(budget, params=undrawable), path)
    with pytest.raises(RoundRefused, match="cannot be drawn"):
        admit(own_undrawable, config, 0, params=undrawable, train=False)
    assert not path.exists()


def test_the_ledger_refuses_past_the_budget_and_survives_a_restart(tmp_path):
    """rounds + 1 releases fit the declared budget exactly; one more, in another run or after a restart, does not."""
    config = ldp_run()
    path = tmp_path / "ledger.jsonl"
    guard = ClientGuard(declared_budget(config, sizes(config)[0]), path)
    for round_index in range(config.rounds + 1):
        admit(guard, config, round_index, train=round_index > 0)
    spent = guard.spent(RELEASES)
    planned = plan_privacy(config, sizes(config)).planned_epsilon
    assert spent == pytest.approx(planned, rel=1e-9) and spent <= config.epsilon
    with pytest.raises(RoundRefused, match="past its declared releases budget"):
        admit(guard, config, 0, train=False, run=2)  # the server starts the run over
    restarted = ClientGuard(declared_budget(config, sizes(config)[0]), path)  # a new process, the same file
    assert restarted.spent(RELEASES) == pytest.approx(spent, rel=1e-12)
    with pytest.raises(RoundRefused, match="past its declared releases budget"):
        admit(restarted, config, 0, train=False, run=3)
    assert len(path.read_text().splitlines()) == config.rounds + 1  # refused rounds charge nothing


def test_a_round_answered_once_is_not_answered_again_and_rounds_stay_within_the_run(tmp_path):
    """Answering one round twice lets the server difference two SecAgg+ sums that differ by this client alone."""
    config = build_config(**SMALL, mechanism="kanon")
    path = tmp_path / "ledger.jsonl"
    guard = ClientGuard(declared_budget(config, sizes(config)[0]), path)
    admit(guard, config, 0, train=False)
    admit(guard, config, 1)
    for replay in (1, 0):
        with pytest.raises(RoundRefused, match="comes after round 1"):
            admit(ClientGuard(declared_budget(config, sizes(config)[0]), path), config, replay)
    with pytest.raises(RoundRefused, match="outside the declared run"):
        admit(guard, config, config.rounds + 1)
    admit(guard, config, 0, train=False, run=2)  # another run numbers its rounds afresh


def test_admission_reads_the_ledger_again_under_a_lock(tmp_path):
    """Two processes sharing a node's ledger cannot both spend the last of its budget."""
    import fcntl
    import threading

    config = ldp_run()
    budget = declared_budget(config, sizes(config)[0])
    spender = ClientGuard(budget, tmp_path / "elsewhere.jsonl")
    for round_index in range(config.rounds + 1):
        admit(spender, config, round_index, train=round_index > 0)
    path = tmp_path / "ledger.jsonl"
    waiting = ClientGuard(budget, path)  # read while the ledger was still empty
    outcome: list[BaseException | None] = []

    def admit_now() -> None:
        try:
            admit(waiting, config, 0, train=False, run=9)
            outcome.append(None)
        except RoundRefused as err:
            outcome.append(err)

    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process is admitting a round
        thread = threading.Thread(target=admit_now)
        thread.start()
        thread.join(timeout=2)
        assert thread.is_alive() and not outcome  # it waits for the lock
        path.write_text((tmp_path / "elsewhere.jsonl").read_text())  # what the other process spent meanwhile
        fcntl.flock(lock, fcntl.LOCK_UN)
    thread.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], RoundRefused)


def test_a_round_is_charged_before_it_runs_and_a_weakened_round_charges_nothing(tmp_path):
    config = ldp_run()
    path = tmp_path / "ledger.jsonl"
    guard = ClientGuard(declared_budget(config, sizes(config)[0]), path)
    params = server_params(config)
    with pytest.raises(RoundRefused):
        admit(guard, config, 1, params={**params, "sum_noise_multiplier": params["sum_noise_multiplier"] / 2})
    assert not path.exists() and guard.spent(RELEASES) == 0.0
    admit(guard, config, 1)
    assert len(path.read_text().splitlines()) == 1 and guard.spent(RELEASES) > 0


def test_a_node_cap_below_the_runs_budget_stops_the_node_earlier(tmp_path):
    config = ldp_run(dp_sgd=True)
    dp_sgd = plan_privacy(config, sizes(config)).dp_sgd.settings
    guard = ClientGuard(declared_budget(config, sizes(config)[0], node_cap=(0.7, 1e-6)), tmp_path / "l.jsonl")
    admitted = 0
    with pytest.raises(RoundRefused, match="past its own privacy cap"):
        for run in range(config.rounds + 1):
            admit(guard, config, 0, train=False, run=run, dp_sgd=dp_sgd)
            admitted += 1
    assert 1 <= admitted < config.rounds + 1


def test_a_node_cap_refuses_what_no_per_image_epsilon_covers(tmp_path):
    """A capped node takes part only in DP releases and DP-SGD updates of runs with DP-SGD, whatever the run config
    declares: without DP-SGD, BatchNorm makes a release's epsilon one per representation, not per image."""
    kanon = build_config(**SMALL, mechanism="kanon")
    with pytest.raises(RoundRefused, match="only in differentially private releases"):
        admit(ClientGuard(declared_budget(kanon, sizes(kanon)[0], node_cap=(5.0, 1e-6))), kanon, 0, train=False)
    config = ldp_run()
    guard = ClientGuard(declared_budget(config, sizes(config)[0], node_cap=(5.0, 1e-6)))
    for round_index, train in ((0, False), (1, True)):
        with pytest.raises(RoundRefused, match="only in runs with DP-SGD"):
            admit(guard, config, round_index, train=train)
    private = ldp_run(dp_sgd=True)
    dp_sgd = plan_privacy(private, sizes(private)).dp_sgd.settings
    guard = ClientGuard(declared_budget(private, sizes(private)[0], node_cap=(50.0, 1e-6)))
    admit(guard, private, 0, train=False, dp_sgd=dp_sgd)
    admit(guard, private, 1, dp_sgd=dp_sgd)


def test_dp_sgd_is_charged_on_the_clients_own_ledger_as_the_server_plans_it(tmp_path):
    config = build_config(**SMALL, mechanism="kanon", dp_sgd=True)
    plan = plan_privacy(config, sizes(config))
    guard = ClientGuard(declared_budget(config, sizes(config)[0]), tmp_path / "l.jsonl")
    for round_index in range(config.rounds + 1):
        admit(guard, config, round_index, dp_sgd=plan.dp_sgd.settings, train=round_index > 0)
    assert 0 < guard.spent(DP_SGD) <= plan.dp_sgd.planned_epsilon * (1 + 1e-9)
    with pytest.raises(RoundRefused, match="past its declared dp-sgd budget"):
        admit(guard, config, 1, dp_sgd=plan.dp_sgd.settings, run=2)


def test_a_cut_short_ledger_is_refused_rather_than_read_as_empty(tmp_path):
    config = ldp_run()
    path = tmp_path / "ledger.jsonl"
    guard = ClientGuard(declared_budget(config, sizes(config)[0]), path)
    admit(guard, config, 0, train=False)
    path.write_text(path.read_text() + '{"client": 0, "rou')
    with pytest.raises(ValueError, match="line 2"):
        ClientGuard(declared_budget(config, sizes(config)[0]), path)


def test_a_later_run_at_a_larger_delta_gets_no_room_from_an_earlier_runs_entries(tmp_path):
    """Entries charged at delta 1e-6 stay priced at 1e-6: a run at 1e-3 may not spend what they cost less there."""
    path = tmp_path / "ledger.jsonl"
    first = ldp_run(delta=1e-6)
    guard = ClientGuard(declared_budget(first, sizes(first)[0]), path)
    for round_index in range(first.rounds + 1):
        admit(guard, first, round_index, train=round_index > 0)
    spent = composed_epsilon(guard.ledger.events(0), 1e-6)
    later = ldp_run(delta=1e-3)
    budget = declared_budget(later, sizes(later)[0])
    assert composed_epsilon([*guard.ledger.events(0), *budget.release_events], 1e-3) <= later.epsilon  # room at 1e-3
    reopened = ClientGuard(budget, path)
    with pytest.raises(RoundRefused, match="past its declared releases budget"):
        admit(reopened, later, 0, train=False, run=2)
    assert composed_epsilon(reopened.ledger.events(0), 1e-6) == spent and reopened.spent(RELEASES) == pytest.approx(spent)
    assert all(json.loads(line)["delta"] == 1e-6 for line in path.read_text().splitlines())


def test_entries_written_without_a_delta_are_priced_at_the_smallest_delta_a_run_accepts(tmp_path):
    config = ldp_run()
    path = tmp_path / "ledger.jsonl"
    guard = ClientGuard(declared_budget(config, sizes(config)[0]), path)
    admit(guard, config, 0, train=False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in line.items() if k != "delta"}) + "\n" for line in lines))
    legacy = ClientGuard(declared_budget(config, sizes(config)[0]), path)
    assert legacy.ledger.pricing_delta() == LEGACY_DELTA < guard.budget.delta
    assert legacy.spent(RELEASES) == pytest.approx(composed_epsilon(guard.ledger.events(0), LEGACY_DELTA))
    assert legacy.spent(RELEASES) > guard.spent(RELEASES)


def test_a_round_is_charged_the_declared_events_even_when_the_server_computed_them_in_other_last_bits(tmp_path):
    config = ldp_run(dp_sgd=True)
    budget = declared_budget(config, sizes(config)[0])
    params, own = budget.params, budget.dp_sgd
    guard = ClientGuard(budget, tmp_path / "l.jsonl")
    sent = {**params, "sum_noise_multiplier": params["sum_noise_multiplier"] * (1 + 1e-12)}
    admit(guard, config, 1, params=sent, dp_sgd=dataclasses.replace(own, noise_multiplier=own.noise_multiplier * (1 + 1e-12)))
    assert guard.ledger.events(0, RELEASES) == budget.release_events
    assert guard.ledger.events(0, DP_SGD) == budget.training_events
    assert guard.own_parameters() == (params, own)


def test_ldp_sums_passes_the_guard_unchanged_and_a_weaker_or_noisier_multiplier_does_not():
    config = build_config(**{**SMALL, "mechanism": "ldp-sums", "epsilon": 1.0})
    budget = declared_budget(config, sizes(config)[0])
    params = server_params(config)
    assert check_release_parameters(budget, "ldp-sums", params) == budget.release_events
    for factor in (0.5, 2.0):
        with pytest.raises(RoundRefused, match="noise_multiplier"):
            check_release_parameters(budget, "ldp-sums", {**params, "noise_multiplier": params["noise_multiplier"] * factor})


def test_the_secret_samples_rate_is_checked_like_every_other_cost_parameter():
    config = build_config(**{**SMALL, "mechanism": "ldp-sums", "epsilon": 1.0, "memory_size": 16})
    budget = declared_budget(config, sizes(config)[0])
    params = server_params(config)
    assert 0 < params["sampling_rate"] < 1 and budget.release_events[0].name == "poisson_gaussian"
    for rate in (1.0, params["sampling_rate"] * 2, params["sampling_rate"] / 2):
        with pytest.raises(RoundRefused, match="sampling_rate"):
            check_release_parameters(budget, "ldp-sums", {**params, "sampling_rate": rate})
