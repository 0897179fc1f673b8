"""The server-side driver charges what it planned, for accepted and rejected replies alike (the checks are federation/reply_checks.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from mechanisms import Guarantee, Release, create_mechanism
from privfed.errors import PrivfedError
from privfed.orchestra.round_report import Rejection, RoundReport
from privfed.run.driver import RunDriver
from privfed.run.interruption import StopRequest
from privfed.run.plan import plan_resume, plan_run
from privfed.run.stop import BUDGET, INTERRUPTED, NO_UPDATES, UNUSABLE_ROUND, Stop, run_failed


def started(config) -> RunDriver:
    driver = RunDriver(plan_run(config))
    driver.start()
    return driver


def report(*releases: tuple[int, Release]) -> RoundReport:
    return RoundReport(round=0, completed=len(releases), failures=0, seconds=0.1, server_stats={},
                       sampled_clients=tuple(client for client, _ in releases), releases=list(releases))


def vectors(n: int = 4, dim: int = 16) -> torch.Tensor:
    return F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(n)), dim=1)


@pytest.fixture
def ldp_driver(tiny_config, tmp_path) -> RunDriver:
    return started(tiny_config.replace(mechanism="ldp", epsilon=2.0, out=str(tmp_path / "run")))


def honest_ldp_release(driver: RunDriver) -> Release:
    mechanism = create_mechanism("ldp", **driver.plan.privacy.params)
    return mechanism.release(vectors(32), num_centroids=4, generator=torch.Generator().manual_seed(0))


def ledger_lines(driver: RunDriver) -> list[dict]:
    return [json.loads(line) for line in (driver.run_dir.path / "ledger.jsonl").read_text().splitlines()]


def test_an_honest_release_is_charged_the_planned_events(ldp_driver):
    ldp_driver.on_round_end(report((1, honest_ldp_release(ldp_driver))))
    (entry,) = ledger_lines(ldp_driver)
    planned = [{"name": e.name, "params": e.params} for e in ldp_driver.plan.privacy.per_release_events]
    assert entry["client"] == 1 and entry["events"] == planned
    assert ldp_driver.ledger.worst_case_summary().epsilon > 0


def test_a_rejected_reply_from_an_asked_client_is_charged_as_planned_once(ldp_driver):
    rejected = [Rejection(2, "release holds NaN or Inf"), Rejection(2, "more than one reply"), Rejection(None, "node 9")]
    ldp_driver.on_round_end(dataclasses.replace(report((1, honest_ldp_release(ldp_driver))), rejected=rejected))
    lines = ledger_lines(ldp_driver)
    assert [line["client"] for line in lines] == [1, 2]  # the unasked node is nobody's cost
    assert lines[0]["events"] == lines[1]["events"] and "rejected" in lines[1]["guarantee"]["statement"]
    (round_line,) = ldp_driver.run_dir.metrics()
    assert round_line["rejected_replies"] == 3 and round_line["rejection_reasons"][0]["reason"] == "release holds NaN or Inf"


def test_the_k_the_checks_credited_is_the_k_charged(tiny_config, tmp_path):
    driver = started(tiny_config.replace(kanon_min_k=2, out=str(tmp_path / "run")))
    credited = Release(vectors(), torch.tensor([3.0, 9.0, 9.0, 9.0]), Guarantee(kind="k-anonymity", statement="", k=3))
    empty = Release(torch.zeros(0, 16), torch.zeros(0), Guarantee(kind="k-anonymity", statement="", k=None))
    driver.on_round_end(report((0, credited), (1, empty)))
    assert driver.ledger.min_k == 3
    assert [line["guarantee"]["k"] for line in ledger_lines(driver)] == [3, None]
    (round_line,) = driver.run_dir.metrics()
    assert round_line["min_k"] == 3


def test_a_kanon_run_that_released_nothing_states_its_k_floor_not_a_question_mark(tiny_config, tmp_path):
    """Rounds whose clients released nothing: every centroid kanon could have released averages >= min_k images."""
    driver = started(tiny_config.replace(kanon_min_k=6, out=str(tmp_path / "run")))
    empty = Release(torch.zeros(0, 16), torch.zeros(0), Guarantee(kind="k-anonymity", statement="", k=None))
    driver.on_round_end(report((0, empty), (1, empty)))
    privacy = driver.privacy_summary()
    assert privacy["k"] is None  # the ledger's own figure: nothing was released
    assert "at least 6 distinct images" in privacy["headline"] and "?" not in privacy["statement"]


def test_a_k_claim_from_a_mechanism_that_is_not_k_anonymous_is_ignored(tiny_config, tmp_path):
    driver = started(tiny_config.replace(mechanism="reps", out=str(tmp_path / "run")))
    claimed = Release(vectors(), torch.ones(4), Guarantee(kind="none", statement="", k=1000))
    driver.on_round_end(report((0, claimed)))
    assert driver.ledger.min_k is None


def test_a_training_round_charges_the_planned_dp_sgd_cost_of_every_reply_rejected_ones_included(tiny_config, tmp_path):
    driver = started(tiny_config.replace(dp_sgd=True, out=str(tmp_path / "run")))
    release = Release(vectors(), torch.full((4,), 8.0), Guarantee(kind="k-anonymity", statement="", k=8))
    training = RoundReport(round=1, completed=1, failures=0, seconds=0.1, server_stats={}, sampled_clients=(0, 1),
                           releases=[(0, release)], training_events=[(0, ())], rejected=[Rejection(1, "bad")])
    driver.on_round_end(training)
    charged = [line for line in ledger_lines(driver) if line["kind"] == "dp_sgd"]
    assert [line["client"] for line in charged] == [0, 1]
    for line in charged:
        planned = driver.plan.privacy.dp_sgd.round_events(driver.plan.client_sizes[line["client"]])
        assert line["events"] == [{"name": e.name, "params": e.params} for e in planned]


def resumed(driver: RunDriver) -> RunDriver:
    plan, point = plan_resume(driver.run_dir.path, {})
    again = RunDriver(plan, resume=point)
    again.start()
    return again


def round_with_one_reply(driver: RunDriver, round_index: int) -> RoundReport:
    """Clients 0, 1 and 2 were asked; only client 0 answered."""
    return dataclasses.replace(report((0, honest_ldp_release(driver))), round=round_index, sampled_clients=(0, 1, 2))


@pytest.fixture
def ldp_after_round_0(tiny_config, tmp_path) -> RunDriver:
    driver = started(tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=3, checkpoint_every=1, out=str(tmp_path / "run")))
    release = honest_ldp_release(driver)
    driver.on_round_end(dataclasses.replace(report((0, release), (1, release), (2, release))))
    return driver


def test_after_a_kill_the_round_in_progress_charges_its_silent_clients(ldp_after_round_0):
    # The process died during round 1: no summary, the resume point at round 0.
    again = resumed(ldp_after_round_0)
    again.on_round_end(round_with_one_reply(again, 1))
    again.on_round_end(round_with_one_reply(again, 2))
    round_1 = [line for line in ledger_lines(again) if line["round"] == 1]
    assert [line["client"] for line in round_1] == [0, 1, 2]  # 1 and 2 may have released before the kill
    assert all("killed" in line["guarantee"]["statement"] for line in round_1[1:])
    assert [line["client"] for line in ledger_lines(again) if line["round"] == 2] == [0]  # later silence costs nothing


def test_after_a_clean_stop_no_silent_client_is_charged(tiny_config, tmp_path):
    request = StopRequest()
    config = tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=3, checkpoint_every=1, out=str(tmp_path / "run"))
    driver = RunDriver(plan_run(config), stop=request)
    driver.start()
    request.request("interrupted by SIGINT")  # Ctrl-C during round 0: the run stops after it, as a real one
    release = honest_ldp_release(driver)
    assert driver.on_round_end(report((0, release), (1, release), (2, release))).startswith("interrupted by SIGINT")
    driver.finish(secure_aggregation={"enabled": False})
    again = resumed(driver)
    assert not (again.run_dir.path / "summary.json").exists()  # the run is running again
    again.on_round_end(round_with_one_reply(again, 1))
    assert [line["client"] for line in ledger_lines(again) if line["round"] == 1] == [0]


def test_a_run_that_logged_rounds_after_its_resume_point_is_not_resumed(tiny_config, tmp_path):
    driver = started(tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=3, checkpoint_every=3, out=str(tmp_path / "run")))
    release = honest_ldp_release(driver)
    for round_index in (0, 1, 2):  # the resume point stays at round 0; round 1 alone would be replayed
        driver.on_round_end(dataclasses.replace(report((0, release)), round=round_index))
    with pytest.raises(PrivfedError, match="ran round 1 to 2 after its last resume point"):
        plan_resume(driver.run_dir.path, {})


def test_an_ldp_run_cannot_stretch_its_budget_over_more_rounds_on_resume(ldp_after_round_0):
    with pytest.raises(PrivfedError, match="would change the privacy calibration"):
        plan_resume(ldp_after_round_0.run_dir.path, {"rounds": 5})
    assert plan_resume(ldp_after_round_0.run_dir.path, {"rounds": 3})[1].round == 0  # the same rounds: fine


def test_a_run_stopped_by_its_privacy_budget_is_not_resumed(ldp_after_round_0):
    ldp_after_round_0.stop = Stop(BUDGET, 0, "privacy budget: another release would bring a client to epsilon 2.1 > 2.0")
    ldp_after_round_0.finish(secure_aggregation={"enabled": False})
    with pytest.raises(PrivfedError, match="privacy budget ran out"):
        plan_resume(ldp_after_round_0.run_dir.path, {})


def test_a_round_in_which_no_client_trained_stops_the_run_with_a_summary_that_says_why(tiny_config, tmp_path):
    """A SecAgg+ round halted with no usable reply (every client failed or was rejected) ends the run, and
    `privfed train` exits non-zero for it, instead of running every round with nobody training."""
    from privfed.cli import FAILED_RUN_EXIT_CODE, train_exit_code

    driver = started(tiny_config.replace(rounds=3, out=str(tmp_path / "run")))
    driver.on_round_end(RoundReport(round=0, completed=2, failures=0, seconds=0.1, server_stats={}, sampled_clients=(0, 1)))
    halted = RoundReport(round=1, completed=0, failures=2, seconds=0.1, server_stats={"secagg_halted": 1.0},
                         sampled_clients=(0, 1), rejected=[Rejection(1, "release holds NaN or Inf")])
    reason = driver.on_round_end(halted)
    assert "round 1: no usable reply from its 2 sampled clients (1 failed, 1 rejected: client 1: release holds NaN" in reason
    summary = driver.finish(secure_aggregation={"enabled": True})
    on_disk = json.loads((driver.run_dir.path / "summary.json").read_text())
    assert on_disk["stopped_early"] == reason and on_disk["stop"] == {"cause": UNUSABLE_ROUND, "round": 1, "message": reason}
    assert summary["rounds"] == 1 and run_failed(summary) and train_exit_code(summary) == FAILED_RUN_EXIT_CODE


def dropped(round_index: int, why: str | None = "secure aggregation halted") -> RoundReport:
    """A training round in which both sampled clients replied; ``why`` its update was dropped (None: applied)."""
    return RoundReport(round=round_index, completed=2, failures=0, seconds=0.1, server_stats={}, sampled_clients=(0, 1),
                       update_dropped=why)


def test_three_training_rounds_in_a_row_without_an_applied_update_stop_the_run(tiny_config, tmp_path):
    from privfed.cli import FAILED_RUN_EXIT_CODE, train_exit_code

    driver = started(tiny_config.replace(rounds=5, out=str(tmp_path / "run")))
    assert driver.on_round_end(dropped(0, None)) is None
    assert driver.on_round_end(dropped(1, "2 aggregated tensors overflowed SecAgg+'s clipping range")) is None
    assert driver.on_round_end(dropped(2)) is None
    reason = driver.on_round_end(dropped(3))
    assert reason == (
        "rounds 1 to 3 applied no model update (2 aggregated tensors overflowed SecAgg+'s clipping range; secure "
        "aggregation halted); the model is unchanged since round 0 and the run stops"
    )
    summary = driver.finish(secure_aggregation={"enabled": True})
    assert summary["stop"] == {"cause": NO_UPDATES, "round": 3, "message": reason} and summary["rounds"] == 3
    assert train_exit_code(summary) == FAILED_RUN_EXIT_CODE


def test_an_applied_update_starts_the_count_again(tiny_config, tmp_path):
    driver = started(tiny_config.replace(rounds=5, out=str(tmp_path / "run")))
    for report_ in (dropped(0, None), dropped(1), dropped(2), dropped(3, None), dropped(4), dropped(5)):
        assert driver.on_round_end(report_) is None
    assert driver.finish(secure_aggregation={"enabled": True})["stop"] is None


def test_the_count_of_rounds_without_an_update_survives_a_resume(tiny_config, tmp_path):
    driver = started(tiny_config.replace(rounds=5, checkpoint_every=1, out=str(tmp_path / "run")))
    for report_ in (dropped(0, None), dropped(1), dropped(2)):
        driver.on_round_end(report_)
    driver.stop = Stop(INTERRUPTED, 2, "interrupted by SIGINT; stopped after round 2")
    driver.finish(secure_aggregation={"enabled": True})
    again = resumed(driver)
    assert again.on_round_end(dropped(3)).startswith("rounds 1 to 3 applied no model update")


def test_a_spent_budget_outranks_an_earlier_stop_so_the_run_is_never_resumed(ldp_after_round_0):
    driver = ldp_after_round_0
    object.__setattr__(driver.plan.privacy, "budget", 1e-9)  # every further release would exceed it
    halted = RoundReport(round=1, completed=0, failures=2, seconds=0.1, server_stats={}, sampled_clients=(0, 1),
                         rejected=[Rejection(0, "bad"), Rejection(1, "bad")])
    driver.on_round_end(halted)
    assert driver.stop is not None and driver.stop.cause == BUDGET
    driver.finish(secure_aggregation={"enabled": False})
    with pytest.raises(PrivfedError, match="privacy budget ran out"):
        plan_resume(driver.run_dir.path, {})


def test_the_budget_stop_is_read_from_its_field_and_an_old_summary_from_its_words(ldp_after_round_0):
    """Reworded, a budget stop is still one; a summary written before the field says it by its opening words."""
    driver = ldp_after_round_0
    driver.stop = Stop(BUDGET, 0, "no further release fits the budget")
    driver.finish(secure_aggregation={"enabled": False})
    with pytest.raises(PrivfedError, match="privacy budget ran out"):
        plan_resume(driver.run_dir.path, {})
    old = {k: v for k, v in driver.run_dir.read_json("summary.json").items() if k != "stop"}
    old["stopped_early"] = "privacy budget: another release would bring a client to epsilon 2.1 > 2.0"
    driver.run_dir.write_json("summary.json", old)
    with pytest.raises(PrivfedError, match="privacy budget ran out"):
        plan_resume(driver.run_dir.path, {})


def test_rounds_with_a_usable_reply_go_on_and_the_finished_run_exits_0(tiny_config, tmp_path):
    from privfed.cli import train_exit_code

    driver = started(tiny_config.replace(rounds=1, out=str(tmp_path / "run")))
    for round_ in (0, 1):  # one of the two sampled clients failed each round
        assert driver.on_round_end(RoundReport(round=round_, completed=1, failures=1, seconds=0.1, server_stats={},
                                               sampled_clients=(0, 1))) is None
    summary = driver.finish(secure_aggregation={"enabled": False})
    assert summary["stopped_early"] is None and train_exit_code(summary) == 0


def test_a_round_charged_before_a_kill_and_replayed_in_other_words_charges_nothing_twice(tiny_config, tmp_path):
    """ldp with DP-SGD, killed between round 1's charges and its metrics line: on the replay an accepted client is silent
    (in progress), a rejected one is accepted and a silent one rejected; each is the same cost in other words."""
    config = tiny_config.replace(mechanism="ldp", epsilon=8.0, dp_sgd=True, rounds=3, checkpoint_every=1,
                                 out=str(tmp_path / "run"))
    driver = started(config)
    release = honest_ldp_release(driver)
    driver.on_round_end(report((0, release), (1, release), (2, release)))
    first = RoundReport(round=1, completed=1, failures=0, seconds=0.1, server_stats={}, sampled_clients=(0, 1, 2),
                        releases=[(0, release)], training_events=[(0, ())], rejected=[Rejection(1, "bad")])
    driver.charge_releases.charge(first)
    driver.charge_training.charge(first)  # killed here: no metrics line, no resume point, no summary
    charged = [line for line in ledger_lines(driver) if line["round"] == 1]
    assert sorted((line["client"], line["kind"]) for line in charged) == [(0, "dp_sgd"), (0, "release"), (1, "dp_sgd"),
                                                                          (1, "release")]
    again = resumed(driver)
    spent = [again.ledger.spent(client) for client in (0, 1)]
    replay = RoundReport(round=1, completed=1, failures=0, seconds=0.1, server_stats={}, sampled_clients=(0, 1, 2),
                         releases=[(1, release)], training_events=[(1, ())], rejected=[Rejection(2, "bad")])
    again.on_round_end(replay)
    round_1 = [line for line in ledger_lines(again) if line["round"] == 1]
    assert sorted((line["client"], line["kind"]) for line in round_1) == sorted(
        [(c, k) for c in (0, 1, 2) for k in ("dp_sgd", "release")]
    )  # client 2's first charge: it answered only now
    assert [again.ledger.spent(client) for client in (0, 1)] == pytest.approx(spent)  # round 1 paid once each
