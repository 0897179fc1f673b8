"""Review of issue 44's claims: a budget-stopped run never resumes, a run that applied nothing never ends "done",
and a new run writes only into a folder that holds nothing."""

from __future__ import annotations

import json
import os

import pytest

from privfed.errors import PrivfedError
from privfed.orchestra.round_report import RoundReport
from privfed.run.directory import RunDirectory
from privfed.run.plan import plan_resume
from privfed.run.stop import BUDGET, NO_UPDATES, Stop
from tests.run.test_driver import dropped, honest_ldp_release, report, started


@pytest.fixture
def budget_stopped(tiny_config, tmp_path):
    """An ldp run its budget stopped: one more release at epsilon 0.8 would take client 0 past 2."""
    driver = started(tiny_config.replace(mechanism="ldp", epsilon=2.0, epsilon_per_release=0.8, participation=0.5,
                                         rounds=5, checkpoint_every=1, out=str(tmp_path / "run")))
    release = honest_ldp_release(driver)
    driver.on_round_end(report((0, release), (1, release)))
    for round_ in range(1, 5):
        driver.on_round_end(RoundReport(round=round_, completed=2, failures=0, seconds=0.1, server_stats={},
                                        sampled_clients=(0, 1), releases=[(0, release), (1, release)]))
        if driver.stop is not None:
            break
    assert driver.stop is not None and driver.stop.cause == BUDGET
    driver.finish(secure_aggregation={"enabled": False})
    return driver


@pytest.mark.parametrize("edit", ["summary deleted", "stop field edited"])
def test_a_budget_stopped_run_is_not_resumed_after_its_summary_is_edited(budget_stopped, edit):
    summary = budget_stopped.run_dir.path / "summary.json"
    if edit == "summary deleted":
        summary.unlink()
    else:
        record = json.loads(summary.read_text())
        record["stop"] = Stop("interrupted", 1, "interrupted by SIGINT; stopped after round 1").to_dict()
        record["stopped_early"] = record["stop"]["message"]
        summary.write_text(json.dumps(record))
    with pytest.raises(PrivfedError, match="privacy budget"):
        plan_resume(budget_stopped.run_dir.path, {})


def test_a_run_shorter_than_the_stop_rule_that_applied_no_update_does_not_end_done(tiny_config, tmp_path):
    from privfed.cli import FAILED_RUN_EXIT_CODE, train_exit_code

    driver = started(tiny_config.replace(rounds=2, out=str(tmp_path / "run")))
    for report_ in (dropped(0, None), dropped(1), dropped(2)):
        driver.on_round_end(report_)
    summary = driver.finish(secure_aggregation={"enabled": True})
    assert summary["stop"] is not None and summary["stop"]["cause"] == NO_UPDATES
    assert train_exit_code(summary) == FAILED_RUN_EXIT_CODE


@pytest.mark.parametrize("name", ["checkpoints", "client-ledgers", "elsewhere"])
def test_a_folder_holding_only_a_link_to_a_folder_is_not_unused(tmp_path, name):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "final.pt").write_bytes(b"a user's file")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(theirs, out / name)
    with pytest.raises(PrivfedError, match=name):
        RunDirectory(out).check_unused()


def resumed_with_round_1(driver, forge: bool) -> float:
    """Client 0's epsilon after a resume that ran round 1, ``forge``: a cheap charge of its round 1 appended by hand."""
    from tests.run.test_driver import resumed, round_with_one_reply

    driver.stop = Stop("interrupted", 0, "interrupted by SIGINT; stopped after round 0")
    driver.finish(secure_aggregation={"enabled": False})
    ledger = driver.run_dir.path / "ledger.jsonl"
    if forge:
        entry = json.loads(ledger.read_text().splitlines()[0])
        assert entry["client"] == 0
        entry["round"] = 1
        for event in entry["events"]:  # the same events, almost free
            params = event["params"]
            params.update(count=1)
            if "noise_parameter" in params:  # discrete Laplace: epsilon = sensitivity * parameter
                params["noise_parameter"] *= 1e-3
            if "noise_multiplier" in params:
                params["noise_multiplier"] *= 1e3
        with ledger.open("a") as file:
            file.write(json.dumps(entry) + "\n")
    again = resumed(driver)
    again.on_round_end(round_with_one_reply(again, 1))
    return again.ledger.spent(0)


def test_a_cheap_charge_appended_for_the_next_round_is_refused_before_training(tiny_config, tmp_path):
    """Not the planned parameters: counted, it would lower no epsilon (the ledger composes both charges); the resume
    refuses it first, since the spent budget is not the run's own."""
    def stopped(name: str):
        driver = started(tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=3, checkpoint_every=1,
                                             out=str(tmp_path / name)))
        release = honest_ldp_release(driver)
        driver.on_round_end(report((0, release), (1, release), (2, release)))
        return driver

    resumed_with_round_1(stopped("honest"), forge=False)
    with pytest.raises(PrivfedError, match="events this run does not make"):
        resumed_with_round_1(stopped("forged"), forge=True)


def test_a_run_killed_in_finish_after_its_last_round_can_still_get_its_summary(tiny_config, tmp_path):
    driver = started(tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=1, checkpoint_every=1,
                                         out=str(tmp_path / "run")))
    release = honest_ldp_release(driver)
    driver.on_round_end(report((0, release), (1, release)))
    driver.on_round_end(RoundReport(round=1, completed=2, failures=0, seconds=0.1, server_stats={},
                                    sampled_clients=(0, 1), releases=[(0, release), (1, release)]))
    # killed inside finish(): the last resume point is written, summary.json is not
    assert not (driver.run_dir.path / "summary.json").exists()
    plan_resume(driver.run_dir.path, {})


def test_a_summary_written_by_hand_into_a_killed_run_does_not_spare_the_round_in_progress(tiny_config, tmp_path):
    from tests.run.test_driver import ledger_lines, resumed, round_with_one_reply

    driver = started(tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=3, checkpoint_every=1,
                                         out=str(tmp_path / "run")))
    release = honest_ldp_release(driver)
    driver.on_round_end(report((0, release), (1, release), (2, release)))
    # killed in round 1, when clients 1 and 2 may have released; then a summary.json is written by hand
    stop = Stop("interrupted", 0, "interrupted by SIGINT; stopped after round 0").to_dict()
    driver.run_dir.write_json("summary.json", {"stop": stop, "stopped_early": stop["message"]})
    again = resumed(driver)
    again.on_round_end(round_with_one_reply(again, 1))
    assert [line["client"] for line in ledger_lines(again) if line["round"] == 1] == [0, 1, 2]


@pytest.mark.parametrize("edit", ["another mechanism", "no events"])
def test_a_charge_of_another_shape_appended_for_the_next_round_is_refused_before_training(tiny_config, tmp_path, edit):
    """Replaying round 1, the ledger would refuse the run's own charge as a second one of other events: a traceback."""
    driver = started(tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=3, checkpoint_every=1,
                                         out=str(tmp_path / "run")))
    driver.on_round_end(report((0, honest_ldp_release(driver))))
    driver.stop = Stop("interrupted", 0, "interrupted by SIGINT; stopped after round 0")
    driver.finish(secure_aggregation={"enabled": False})
    ledger = driver.run_dir.path / "ledger.jsonl"
    entry = json.loads(ledger.read_text().splitlines()[0])
    entry.update(round=1, events=[])
    if edit == "another mechanism":
        entry.update(mechanism="kanon", guarantee={"kind": "k-anonymity", "statement": "by hand", "k": 1000})
    with ledger.open("a") as file:
        file.write(json.dumps(entry) + "\n")
    with pytest.raises(PrivfedError, match=f"{ledger} charges client 0 in round 1 with .* this run does not make"):
        plan_resume(driver.run_dir.path, {})


def test_the_old_summary_copied_back_into_a_killed_resume_does_not_spare_the_round_in_progress(tiny_config, tmp_path):
    """The resume unmarks the point before it deletes the summary: the summary of the clean stop no longer matches."""
    from tests.run.test_driver import ledger_lines, resumed, round_with_one_reply

    driver = started(tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=3, checkpoint_every=1,
                                         out=str(tmp_path / "run")))
    release = honest_ldp_release(driver)
    driver.on_round_end(report((0, release), (1, release), (2, release)))
    driver.stop = Stop("interrupted", 0, "interrupted by SIGINT; stopped after round 0")
    driver.finish(secure_aggregation={"enabled": False})
    summary = driver.run_dir.path / "summary.json"
    clean = summary.read_bytes()
    resumed(driver)  # then killed in round 1, when clients 1 and 2 may have released
    assert not summary.exists()
    summary.write_bytes(clean)
    again = resumed(driver)
    again.on_round_end(round_with_one_reply(again, 1))
    assert [line["client"] for line in ledger_lines(again) if line["round"] == 1] == [0, 1, 2]


def test_a_run_killed_in_finish_after_a_last_round_that_failed_still_says_it_failed(tiny_config, tmp_path):
    """The resume that only finishes keeps the stop the last round recorded in the point."""
    from privfed.orchestra.round_report import Rejection
    from privfed.run.stop import UNUSABLE_ROUND
    from tests.run.test_driver import resumed

    driver = started(tiny_config.replace(rounds=1, checkpoint_every=1, out=str(tmp_path / "run")))
    driver.on_round_end(RoundReport(round=0, completed=2, failures=0, seconds=0.1, server_stats={}, sampled_clients=(0, 1)))
    reason = driver.on_round_end(RoundReport(round=1, completed=0, failures=2, seconds=0.1, server_stats={},
                                             sampled_clients=(0, 1), rejected=[Rejection(1, "bad")]))
    assert reason is not None  # killed inside finish(): no summary
    summary = resumed(driver).finish(secure_aggregation={"enabled": False})
    assert summary["stop"] == {"cause": UNUSABLE_ROUND, "round": 1, "message": reason}


class Killed(BaseException):
    """The process dies here (nothing in privfed catches it, as after ``kill -9``)."""


@pytest.mark.parametrize("where", ["before its summary", "before its point says it ended"])
def test_a_resume_of_a_run_killed_in_finish_writes_its_summary_then_refuses(tiny_config, tmp_path, capsys, where):
    """`privfed train --resume` runs no round and exits 0 with the summary, ε statement and curves; a second is refused."""
    import privfed.run.driver as driver_module
    from privfed.cli import main
    from privfed.federation.simulation import simulate
    from privfed.run.plan import plan_run
    from privfed.run.resume import read_resume_point

    write_json = RunDirectory.write_json

    def writing(directory: RunDirectory, name: str, payload: dict) -> None:
        if name == "summary.json" and where == "before its summary":
            raise Killed
        write_json(directory, name, payload)

    def ending(directory: RunDirectory, ended: bool) -> None:
        raise Killed

    out = tmp_path / "run"
    config = tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=1, device="cpu", out=str(out))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RunDirectory, "write_json", writing)
        patch.setattr(driver_module, "mark_end", ending)
        with pytest.raises(Killed):
            simulate(plan_run(config))
    assert (out / "summary.json").exists() == (where != "before its summary")
    metrics = (out / "metrics.jsonl").read_text()
    ledger = (out / "ledger.jsonl").read_text()
    capsys.readouterr()
    main(["train", "--resume", str(out)])  # returns: exit status 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 1 and summary["stop"] is None and summary["privacy"]["epsilon"] > 0
    assert summary["privacy"]["statement"] and (out / "curves.png").is_file()
    assert (out / "metrics.jsonl").read_text() == metrics and (out / "ledger.jsonl").read_text() == ledger
    assert read_resume_point(RunDirectory(out)).summary_sha256 is not None
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--resume", str(out)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {out} already finished round 1 of 1; resume with more --rounds to go on"
