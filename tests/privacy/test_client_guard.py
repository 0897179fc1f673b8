"""A client charges its own calibration's costs to a ledger that survives restarts, and refuses past its budget.

Threat model: the server samples one client beyond its budget, replays a
round, or starts the run over. The budgets below come from the declared run
alone (the server sends no privacy parameter: tests/federation/test_declared_run.py).
"""

from __future__ import annotations

import json

import pytest

from privfed.config import build_config
from privfed.data.federated import FederatedSplit
from privfed.privacy.budget import plan_privacy
from privfed.privacy.client_guard import LEGACY_DELTA, ClientGuard, RoundRefused, declared_budget
from privfed.privacy.ledger import DP_SGD, RELEASES, composed_epsilon

SMALL = dict(dataset="shapes:200", num_clients=4, participation=0.5, rounds=2, out="unused")


def ldp_run(**changes):
    return build_config(**{**SMALL, "mechanism": "ldp", "epsilon": 1.0, **changes})


def sizes(config) -> list[int]:
    return FederatedSplit.of(config).client_sizes()


def admit(guard: ClientGuard, round_index: int, *, train=True, run=1) -> None:
    guard.admit(run=run, round_index=round_index, train=train)


def test_the_ledger_refuses_past_the_budget_and_survives_a_restart(tmp_path):
    """rounds + 1 releases fit the declared budget exactly; one more, in another run or after a restart, does not."""
    config = ldp_run()
    path = tmp_path / "ledger.jsonl"
    guard = ClientGuard(declared_budget(config, sizes(config)[0]), path)
    for round_index in range(config.rounds + 1):
        admit(guard, round_index, train=round_index > 0)
    spent = guard.spent(RELEASES)
    planned = plan_privacy(config, sizes(config)).planned_epsilon
    assert spent == pytest.approx(planned, rel=1e-9) and spent <= config.epsilon
    with pytest.raises(RoundRefused, match="past its declared releases budget"):
        admit(guard, 0, train=False, run=2)  # the server starts the run over
    restarted = ClientGuard(declared_budget(config, sizes(config)[0]), path)  # a new process, the same file
    assert restarted.spent(RELEASES) == pytest.approx(spent, rel=1e-12)
    with pytest.raises(RoundRefused, match="past its declared releases budget"):
        admit(restarted, 0, train=False, run=3)
    assert len(path.read_text().splitlines()) == config.rounds + 1  # refused rounds charge nothing


def test_a_round_answered_once_is_not_answered_again_and_rounds_stay_within_the_run(tmp_path):
    """Answering one round twice lets the server difference two SecAgg+ sums that differ by this client alone."""
    config = build_config(**SMALL, mechanism="kanon")
    path = tmp_path / "ledger.jsonl"
    guard = ClientGuard(declared_budget(config, sizes(config)[0]), path)
    admit(guard, 0, train=False)
    admit(guard, 1)
    for replay in (1, 0):
        with pytest.raises(RoundRefused, match="comes after round 1"):
            admit(ClientGuard(declared_budget(config, sizes(config)[0]), path), replay)
    with pytest.raises(RoundRefused, match="outside the declared run"):
        admit(guard, config.rounds + 1)
    admit(guard, 0, train=False, run=2)  # another run numbers its rounds afresh


def test_admission_reads_the_ledger_again_under_a_lock(tmp_path):
    """Two processes sharing a node's ledger cannot both spend the last of its budget."""
    import fcntl
    import threading

    config = ldp_run()
    budget = declared_budget(config, sizes(config)[0])
    spender = ClientGuard(budget, tmp_path / "elsewhere.jsonl")
    for round_index in range(config.rounds + 1):
        admit(spender, round_index, train=round_index > 0)
    path = tmp_path / "ledger.jsonl"
    waiting = ClientGuard(budget, path)  # read while the ledger was still empty
    outcome: list[BaseException | None] = []

    def admit_now() -> None:
        try:
            admit(waiting, 0, train=False, run=9)
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


def test_a_node_cap_below_the_runs_budget_stops_the_node_earlier(tmp_path):
    config = ldp_run(dp_sgd=True)
    guard = ClientGuard(declared_budget(config, sizes(config)[0], node_cap=(0.7, 1e-6)), tmp_path / "l.jsonl")
    admitted = 0
    with pytest.raises(RoundRefused, match="past its own privacy cap"):
        for run in range(config.rounds + 1):
            admit(guard, 0, train=False, run=run)
            admitted += 1
    assert 1 <= admitted < config.rounds + 1


def test_a_node_cap_refuses_what_no_per_image_epsilon_covers(tmp_path):
    """A capped node takes part only in DP releases and DP-SGD updates of runs with DP-SGD, whatever the run config
    declares: without DP-SGD, BatchNorm makes a release's epsilon one per representation, not per image."""
    kanon = build_config(**SMALL, mechanism="kanon")
    with pytest.raises(RoundRefused, match="only in differentially private releases"):
        admit(ClientGuard(declared_budget(kanon, sizes(kanon)[0], node_cap=(5.0, 1e-6))), 0, train=False)
    config = ldp_run()
    guard = ClientGuard(declared_budget(config, sizes(config)[0], node_cap=(5.0, 1e-6)))
    for round_index, train in ((0, False), (1, True)):
        with pytest.raises(RoundRefused, match="only in runs with DP-SGD"):
            admit(guard, round_index, train=train)
    private = ldp_run(dp_sgd=True)
    guard = ClientGuard(declared_budget(private, sizes(private)[0], node_cap=(50.0, 1e-6)))
    admit(guard, 0, train=False)
    admit(guard, 1)


def test_dp_sgd_is_charged_on_the_clients_own_ledger_as_the_server_plans_it(tmp_path):
    config = build_config(**SMALL, mechanism="kanon", dp_sgd=True)
    plan = plan_privacy(config, sizes(config))
    guard = ClientGuard(declared_budget(config, sizes(config)[0]), tmp_path / "l.jsonl")
    for round_index in range(config.rounds + 1):
        admit(guard, round_index, train=round_index > 0)
    assert 0 < guard.spent(DP_SGD) <= plan.dp_sgd.planned_epsilon * (1 + 1e-9)
    with pytest.raises(RoundRefused, match="past its declared dp-sgd budget"):
        admit(guard, 1, run=2)


def test_a_cut_short_ledger_is_refused_rather_than_read_as_empty(tmp_path):
    config = ldp_run()
    path = tmp_path / "ledger.jsonl"
    guard = ClientGuard(declared_budget(config, sizes(config)[0]), path)
    admit(guard, 0, train=False)
    path.write_text(path.read_text() + '{"client": 0, "rou')
    with pytest.raises(ValueError, match="line 2"):
        ClientGuard(declared_budget(config, sizes(config)[0]), path)


def test_a_later_run_at_a_larger_delta_gets_no_room_from_an_earlier_runs_entries(tmp_path):
    """Entries charged at delta 1e-6 stay priced at 1e-6: a run at 1e-3 may not spend what they cost less there."""
    path = tmp_path / "ledger.jsonl"
    first = ldp_run(delta=1e-6)
    guard = ClientGuard(declared_budget(first, sizes(first)[0]), path)
    for round_index in range(first.rounds + 1):
        admit(guard, round_index, train=round_index > 0)
    spent = composed_epsilon(guard.ledger.events(0), 1e-6)
    later = ldp_run(delta=1e-3)
    budget = declared_budget(later, sizes(later)[0])
    assert composed_epsilon([*guard.ledger.events(0), *budget.release_events], 1e-3) <= later.epsilon  # room at 1e-3
    reopened = ClientGuard(budget, path)
    with pytest.raises(RoundRefused, match="past its declared releases budget"):
        admit(reopened, 0, train=False, run=2)
    assert composed_epsilon(reopened.ledger.events(0), 1e-6) == spent and reopened.spent(RELEASES) == pytest.approx(spent)
    assert all(json.loads(line)["delta"] == 1e-6 for line in path.read_text().splitlines())


def test_entries_written_without_a_delta_are_priced_at_the_smallest_delta_a_run_accepts(tmp_path):
    config = ldp_run()
    path = tmp_path / "ledger.jsonl"
    guard = ClientGuard(declared_budget(config, sizes(config)[0]), path)
    admit(guard, 0, train=False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in line.items() if k != "delta"}) + "\n" for line in lines))
    legacy = ClientGuard(declared_budget(config, sizes(config)[0]), path)
    assert legacy.ledger.pricing_delta() == LEGACY_DELTA < guard.budget.delta
    assert legacy.spent(RELEASES) == pytest.approx(composed_epsilon(guard.ledger.events(0), LEGACY_DELTA))
    assert legacy.spent(RELEASES) > guard.spent(RELEASES)


def test_a_round_is_charged_the_declared_events(tmp_path):
    config = ldp_run(dp_sgd=True)
    budget = declared_budget(config, sizes(config)[0])
    guard = ClientGuard(budget, tmp_path / "l.jsonl")
    admit(guard, 1)
    assert budget.release_events and guard.ledger.events(0, RELEASES) == budget.release_events
    assert budget.training_events and guard.ledger.events(0, DP_SGD) == budget.training_events
