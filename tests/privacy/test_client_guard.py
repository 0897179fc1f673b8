"""A client computes its own calibration, refuses weaker parameters, and keeps a ledger that survives restarts.

Threat model: the server sends weakened privacy parameters or samples one
client beyond its budget. The budgets below come from the declared run
alone; the "server" is whatever dict a test passes in.
"""

from __future__ import annotations

import dataclasses

import pytest

from privfed.config import build_config
from privfed.data.federated import FederatedSplit
from privfed.privacy.budget import plan_privacy
from privfed.privacy.client_guard import (
    ClientGuard,
    RoundRefused,
    check_dp_sgd_settings,
    check_release_parameters,
    declared_budget,
    weaker_event,
)
from privfed.privacy.ledger import DP_SGD, RELEASES
from mechanisms.base import PrivacyEvent

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


def test_the_honest_servers_parameters_pass_and_more_noise_passes_too():
    config = ldp_run()
    budget = declared_budget(config, sizes(config)[0])
    params = server_params(config)
    check_release_parameters(budget, "ldp", params)
    noisier = {**params, "sum_noise_multiplier": 2 * params["sum_noise_multiplier"], "leaf_count_parameter": params["leaf_count_parameter"] / 2}
    check_release_parameters(budget, "ldp", noisier)


@pytest.mark.parametrize(
    "key, weaken, named",
    [
        ("sum_noise_multiplier", lambda v: v / 2, "gaussian noise_multiplier"),
        ("tree_count_parameter", lambda v: v * 2, "discrete_laplace noise_parameter"),  # a larger decay is less noise
        ("max_depth", lambda v: v + 10, "discrete_laplace count"),  # more tree levels released
    ],
)
def test_a_client_refuses_ldp_parameters_weaker_than_its_own_calibration(key, weaken, named):
    config = ldp_run()
    budget = declared_budget(config, sizes(config)[0])
    params = server_params(config)
    with pytest.raises(RoundRefused, match=named):
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
    check_release_parameters(kanon_budget, "kanon", {"min_k": 8})  # larger sets are stronger
    for weaker in (1, 4, 4.5, "5"):
        with pytest.raises(RoundRefused, match="min_k"):
            check_release_parameters(kanon_budget, "kanon", {"min_k": weaker})


def test_a_client_refuses_weaker_dp_sgd_or_none_at_all():
    config = build_config(**SMALL, mechanism="kanon", dp_sgd=True)
    budget = declared_budget(config, sizes(config)[0])
    own = plan_privacy(config, sizes(config)).dp_sgd.settings
    assert budget.dp_sgd == own
    check_dp_sgd_settings(budget, own)
    check_dp_sgd_settings(budget, dataclasses.replace(own, noise_multiplier=2 * own.noise_multiplier))
    with pytest.raises(RoundRefused, match="noise multiplier"):
        check_dp_sgd_settings(budget, dataclasses.replace(own, noise_multiplier=own.noise_multiplier / 2))
    with pytest.raises(RoundRefused, match="without it"):
        check_dp_sgd_settings(budget, None)


def test_a_fractional_tree_depth_and_another_delta_are_refused():
    config = ldp_run()
    budget = declared_budget(config, sizes(config)[0])
    params = server_params(config)
    with pytest.raises(RoundRefused, match="not a whole number"):
        check_release_parameters(budget, "ldp", {**params, "max_depth": params["max_depth"] - 0.5})
    with pytest.raises(RoundRefused, match="delta"):
        check_release_parameters(budget, "ldp", {**params, "delta": 0.999})


def test_events_the_client_cannot_compare_are_refused():
    own = (PrivacyEvent("gaussian", {"noise_multiplier": 3.0, "count": 1.0}),)
    assert weaker_event(own, own) is None
    assert "cannot be compared" in weaker_event((PrivacyEvent("gaussian", {"noise_multiplier": 3.0, "scale": 1.0}),), own)
    assert "instead of" in weaker_event((PrivacyEvent("laplace", {"b": 3.0}),), own)
    assert "noise_multiplier" in weaker_event((PrivacyEvent("gaussian", {"noise_multiplier": float("nan")}),), own)


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
