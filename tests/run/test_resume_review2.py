"""Second review of issue 44: attacks on the resume binding, the run folder, the headline epsilon and the stop rule.

An attack the code withstands is a plain test; one that breaks a claim is a strict xfail whose reason says what
breaks. The real stopped run is test_resume_integrity's (ldp, 4 clients, Ctrl-C after round 1 of 2); the cheaper
cases drive :class:`privfed.run.driver.RunDriver` by hand, as tests/run/test_driver.py does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mechanisms import Guarantee, Release
from mechanisms.base import PrivacyEvent
from privfed.cli import FAILED_RUN_EXIT_CODE, main, train_exit_code
from privfed.errors import PrivfedError
from privfed.methods import build_network
from privfed.orchestra.round_report import RoundReport
from privfed.privacy.ledger import LedgerEntry, PrivacyLedger, composed_epsilon
from privfed.run.directory import RunDirectory
from privfed.run.plan import plan_resume
from privfed.run.resume import ResumePoint, read_resume_point, write_resume_point
from privfed.run.stop import INTERRUPTED, NO_UPDATES, UNUSABLE_ROUND, Stop
from privfed.secagg.encoding import DecodedAggregate, max_useful_scale, next_scales
from tests.run.test_driver import dropped, honest_ldp_release, report, resumed, started, vectors
from tests.run.test_resume_integrity import client_ledger, refused, resume_refused

# runs, run and no_training: tests/run/conftest.py


# --- 1. The binding: ledgers and config.json ------------------------------------------------------------------------


@pytest.mark.slow  # a real stopped run (test_resume_integrity's), copied per test
def test_reordered_server_ledger_lines_are_refused(run, no_training, capsys):
    ledger = run / "ledger.jsonl"
    lines = ledger.read_text().splitlines(keepends=True)
    ledger.write_text("".join([lines[1], lines[0], *lines[2:]]))
    assert f"{ledger}'s first 8 entries are not those the resume point recorded" in resume_refused(run, capsys)


@pytest.mark.slow  # a real stopped run (test_resume_integrity's), copied per test
def test_a_recorded_server_ledger_line_duplicated_at_the_end_is_refused(run, no_training, capsys):
    ledger = run / "ledger.jsonl"
    last = ledger.read_text().splitlines(keepends=True)[-1]
    with ledger.open("a") as file:
        file.write(last)
    assert f"{ledger} charges round 1 after the entries its resume point (round 1) recorded" in resume_refused(run, capsys)


@pytest.mark.slow  # a real stopped run (test_resume_integrity's), copied per test
def test_client_ledgers_of_one_run_are_alike_so_swapping_them_changes_nothing(run):
    """A client's own ledger names itself client 0 (its node's only client): clients of one size that took part in
    the same rounds keep byte-identical files, and a swap of two is no edit at all."""
    first, second = sorted((run / "client-ledgers").glob("*.jsonl"))[:2]
    assert first.read_bytes() == second.read_bytes()
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    assert plan_resume(run, {})[1].round == 1


def test_two_client_ledgers_that_differ_swapped_are_refused(tiny_config, tmp_path):
    """A stopped run's folder written directly (as tests/test_cli_fuzz.py's fabricate_run), its two client ledgers
    of different rounds bound by the point, then swapped."""
    folder = tmp_path / "run"
    directory = RunDirectory(folder)
    config = tiny_config.replace(rounds=2, out=str(folder))
    directory.create(config)
    directory.append_metrics({"round": 0, "task": "init"})
    directory.append_metrics({"round": 1, "task": "train"})
    guarantee = Guarantee(kind="k-anonymity", statement="k-anonymous", k=5)
    (folder / "ledger.jsonl").write_text(json.dumps(LedgerEntry(0, 0, "kanon", guarantee, ()).to_dict()) + "\n")
    directory.client_ledgers.mkdir()
    first, second = (directory.client_ledgers / f"privfed-ledger-partition-{p}.jsonl" for p in (0, 1))
    first.write_text(json.dumps(LedgerEntry(0, 0, "kanon", guarantee, (), run=0).to_dict()) + "\n")
    second.write_text(json.dumps(LedgerEntry(0, 1, "kanon", guarantee, (), run=0).to_dict()) + "\n")
    network = build_network(config)
    write_resume_point(directory, ResumePoint(round=1, network=network.state_dict(), centroids=None, initialised=True,
                                              server_generator=torch.zeros(1), runtime={}, driver={}))
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    with pytest.raises(PrivfedError, match=f"{first}'s first 1 entries are not those the resume point recorded"):
        plan_resume(folder, {})


@pytest.mark.slow  # a real stopped run (test_resume_integrity's), copied per test
def test_a_client_ledger_renamed_to_a_client_that_has_none_is_refused(run, no_training, capsys):
    ledger = client_ledger(run)
    ledger.rename(ledger.with_name("privfed-ledger-partition-99.jsonl"))
    assert f"{ledger} is gone, but the resume point recorded 2 entries in it" in resume_refused(run, capsys)


@pytest.mark.slow  # a real stopped run (test_resume_integrity's), copied per test
@pytest.mark.parametrize("edit", ["trailing space", "CRLF", "blank line appended", "no final newline"])
def test_whitespace_edits_of_a_ledger_are_refused_in_one_line(run, no_training, capsys, edit):
    ledger = run / "ledger.jsonl"
    data = ledger.read_bytes()
    ledger.write_bytes({
        "trailing space": data.replace(b"}\n", b"} \n", 1),
        "CRLF": data.replace(b"\n", b"\r\n"),
        "blank line appended": data + b"\n",
        "no final newline": data[:-1],
    }[edit])
    assert str(ledger) in resume_refused(run, capsys)


@pytest.mark.slow  # a real stopped run (test_resume_integrity's), copied per test
def test_an_extra_client_ledger_is_accepted_and_only_adds_charges(run):
    """Not bound (the point never knew it), and harmless: every entry in it is a charge more, none is a refund."""
    extra = client_ledger(run).with_name("privfed-ledger-partition-7.jsonl")
    shutil.copy(client_ledger(run), extra)
    point = plan_resume(run, {})[1]
    assert point.round == 1 and "client-ledgers/privfed-ledger-partition-7.jsonl" not in point.ledgers


@pytest.mark.slow  # a real stopped run (test_resume_integrity's), copied per test
def test_config_json_rewritten_with_other_key_order_and_layout_resumes(run):
    """The binding compares config.json's values, not its bytes: a re-serialised file is the same run."""
    path = run / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps(dict(reversed(list(config.items()))), indent=4))
    assert plan_resume(run, {})[1].round == 1


@pytest.mark.slow  # a real stopped run (test_resume_integrity's), copied per test
def test_config_json_with_an_added_key_is_refused_in_one_line(run, no_training, capsys):
    path = run / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "note": "mine"}))
    line = resume_refused(run, capsys)
    assert str(path) in line and "unknown keys: note" in line


@pytest.mark.parametrize("flags", [
    ["--epsilon", "50"], ["--mechanism", "kanon"], ["--seed", "2"], ["--dataset", "shapes:400"], ["--delta", "1e-3"],
    ["--num-clients", "5"], ["--dp-sgd"], ["--memory-size", "64"], ["--lr", "0.5"],
], ids=lambda flags: " ".join(flags))
@pytest.mark.slow  # a real stopped run (test_resume_integrity's), copied per test
def test_other_flags_on_resume_are_refused_in_one_line(run, no_training, capsys, flags):
    line = refused(["train", "--resume", str(run), *flags], run, capsys)
    assert "--resume continues the recorded run; it cannot change" in line


@pytest.mark.slow  # a real stopped run (test_resume_integrity's), copied per test
def test_a_resume_point_of_another_run_of_the_same_configuration_is_refused_even_with_its_config(run, tmp_path,
                                                                                                no_training, capsys):
    """Another run of the same configuration and seed, its config.json and resume.pt both copied in: its ledgers
    are byte-identical, so only the run ids could tell, and they travel together; the point is accepted."""
    other = tmp_path / "other"
    shutil.copytree(run, other)
    record = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**record, "run_id": "0" * 32}))
    write_resume_point(RunDirectory(other), read_resume_point(RunDirectory(other)))
    for name in ("config.json", "checkpoints/resume.pt"):
        shutil.copy(other / name, run / name)
    assert plan_resume(run, {})[1].config["run_id"] == "0" * 32  # the documented limit: a copied folder resumes


def ldp_stopped_after_round_0(tiny_config, tmp_path: Path, name: str = "run", **changes):
    driver = started(tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=3, checkpoint_every=1,
                                         out=str(tmp_path / name), **changes))
    release = honest_ldp_release(driver)
    driver.on_round_end(report((0, release), (1, release), (2, release)))
    driver.stop = Stop(INTERRUPTED, 0, "interrupted by SIGINT; stopped after round 0")
    driver.finish(secure_aggregation={"enabled": False})
    return driver


def test_a_resume_does_not_append_to_a_ledger_linked_from_outside_the_run(tiny_config, tmp_path):
    driver = ldp_stopped_after_round_0(tiny_config, tmp_path)
    elsewhere = tmp_path / "elsewhere" / "ledger.jsonl"
    elsewhere.parent.mkdir()
    ledger = driver.run_dir.path / "ledger.jsonl"
    shutil.move(ledger, elsewhere)
    os.symlink(elsewhere, ledger)
    before = elsewhere.read_bytes()
    try:
        again = resumed(driver)
        again.on_round_end(dataclasses.replace(report((0, honest_ldp_release(again))), round=1))
    except PrivfedError:
        return  # refused: the claim holds
    assert elsewhere.read_bytes() == before


@pytest.mark.parametrize("folder", ["client-ledgers", "checkpoints"])
def test_a_resume_refuses_a_run_folder_whose_ledger_or_checkpoint_folder_is_a_link(tiny_config, tmp_path, folder):
    driver = ldp_stopped_after_round_0(tiny_config, tmp_path)
    inside = driver.run_dir.path / folder
    if not inside.exists():
        inside.mkdir()
    elsewhere = tmp_path / "elsewhere"
    shutil.move(inside, elsewhere)
    os.symlink(elsewhere, inside)
    with pytest.raises(PrivfedError, match=f"{folder} is a link"):
        plan_resume(driver.run_dir.path, {})


def gaussian_heavy(events: tuple[PrivacyEvent, ...], *, alone_above: float, delta: float) -> tuple[PrivacyEvent, ...]:
    """``events`` with the discrete Laplace parts made almost free and the Gaussian's noise lowered until the whole
    costs just more than ``alone_above`` on its own: "costlier" by the ledger's rule for two charges of one round."""

    def variant(sigma: float) -> tuple[PrivacyEvent, ...]:
        out = []
        for event in events:
            params = dict(event.params)
            if event.name == "discrete_laplace":
                params["noise_parameter"] *= 1e-4
            else:
                params["noise_multiplier"] = sigma
            out.append(PrivacyEvent(event.name, params))
        return tuple(out)

    low, high = 0.05, 50.0  # bisection on sigma: low costs more than alone_above, high less
    for _ in range(40):
        middle = (low * high) ** 0.5
        if composed_epsilon(variant(middle), delta, reference_epsilon=2.0) > alone_above:
            low = middle
        else:
            high = middle
    return variant(low)


def test_a_charge_costlier_alone_appended_for_the_replayed_round_does_not_lower_epsilon(tiny_config, tmp_path):
    honest = ldp_stopped_after_round_0(tiny_config, tmp_path, "honest")
    again = resumed(honest)
    again.on_round_end(dataclasses.replace(report((0, honest_ldp_release(again))), round=1))
    honest_epsilon = again.ledger.spent(0)

    forged = ldp_stopped_after_round_0(tiny_config, tmp_path, "forged")
    ledger = forged.run_dir.path / "ledger.jsonl"
    entry = json.loads(ledger.read_text().splitlines()[0])
    planned = forged.plan.privacy.per_release_events
    delta = forged.plan.privacy.delta
    alone = composed_epsilon(planned, delta, reference_epsilon=2.0)
    hand = gaussian_heavy(planned, alone_above=alone, delta=delta)
    assert composed_epsilon(hand, delta, reference_epsilon=2.0) > alone  # the ledger keeps it over the run's own
    entry.update(round=1, events=[{"name": e.name, "params": e.params} for e in hand])
    with ledger.open("a") as file:
        file.write(json.dumps(entry) + "\n")
    with pytest.raises(PrivfedError, match="events this run does not make"):  # not the planned parameters
        resumed(forged)
    ledger_alone = PrivacyLedger.resume(ledger, mechanism="ldp", delta=delta, reference_epsilon=2.0)
    ledger_alone.record(LedgerEntry.from_dict({**entry, "events": [{"name": e.name, "params": e.params} for e in planned]}))
    assert ledger_alone.spent(0) >= honest_epsilon  # and the ledger itself composes both charges of round 1


def kanon_release(k: int) -> Release:
    return Release(vectors(), torch.tensor([float(k)] * 4), Guarantee(kind="k-anonymity", statement="", k=k))


def test_a_kanon_charge_appended_for_the_replayed_round_does_not_raise_the_stated_k(tiny_config, tmp_path):
    def stopped(name: str):
        driver = started(tiny_config.replace(kanon_min_k=2, rounds=3, checkpoint_every=1, out=str(tmp_path / name)))
        driver.on_round_end(report((0, kanon_release(8)), (1, kanon_release(8))))
        driver.stop = Stop(INTERRUPTED, 0, "interrupted by SIGINT; stopped after round 0")
        driver.finish(secure_aggregation={"enabled": False})
        return driver

    def replayed(driver) -> int | None:
        again = resumed(driver)
        again.on_round_end(dataclasses.replace(report((0, kanon_release(3))), round=1))
        return again.ledger.min_k

    assert replayed(stopped("honest")) == 3
    forged = stopped("forged")
    ledger = forged.run_dir.path / "ledger.jsonl"
    entry = json.loads(ledger.read_text().splitlines()[0])
    entry.update(round=1)
    entry["guarantee"]["k"] = 1000
    with ledger.open("a") as file:
        file.write(json.dumps(entry) + "\n")
    assert replayed(forged) == 3


def test_fewer_rounds_on_resume_are_accepted_when_the_calibration_does_not_depend_on_them(tiny_config, tmp_path):
    """docs/usage.md says a resume refuses any change "but more --rounds"; fewer are accepted too (harmless: the run
    spends less). With an --epsilon budget spread over the rounds, fewer are refused."""
    kanon = started(tiny_config.replace(rounds=4, checkpoint_every=1, out=str(tmp_path / "kanon")))
    kanon.on_round_end(report((0, kanon_release(8))))
    kanon.on_round_end(dataclasses.replace(report((0, kanon_release(8))), round=1))
    kanon.stop = Stop(INTERRUPTED, 1, "interrupted by SIGINT; stopped after round 1")
    kanon.finish(secure_aggregation={"enabled": False})
    assert plan_resume(kanon.run_dir.path, {"rounds": 2})[0].config.rounds == 2
    ldp = ldp_stopped_after_round_0(tiny_config, tmp_path, "ldp")
    with pytest.raises(PrivfedError, match="would change the privacy calibration"):
        plan_resume(ldp.run_dir.path, {"rounds": 2})


# --- 3. Nothing is written into a folder that is not this run's ------------------------------------------------------


def test_resume_of_a_folder_that_holds_no_run_writes_nothing_there(tmp_path, capsys):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("a user's file")
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--resume", str(theirs)])
    assert exit_.value.code == 2 and len(capsys.readouterr().err.splitlines()) == 1
    assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]


def test_out_naming_a_file_is_refused_in_one_line_and_the_file_is_untouched(tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("a user's file")
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--dataset", "shapes:300", "--num-clients", "4", "--rounds", "1", "--device", "cpu",
              "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and str(out) in err, err
    assert out.read_text() == "a user's file"


@pytest.mark.slow  # a real stopped run (test_resume_integrity's), copied per test
def test_a_link_to_a_used_folder_as_out_is_refused(runs, tmp_path):
    link = tmp_path / "link"
    os.symlink(runs / "stopped", link)
    with pytest.raises(PrivfedError, match="already holds a run"):
        RunDirectory(link).check_unused()


def test_a_folder_holding_only_empty_folders_counts_as_unused(tmp_path):
    """Nothing in it to mix with: an empty checkpoints/ (or client-ledgers/) is taken over."""
    (tmp_path / "out" / "checkpoints").mkdir(parents=True)
    (tmp_path / "out" / "client-ledgers").mkdir()
    RunDirectory(tmp_path / "out").check_unused()


def test_a_run_lock_link_does_not_make_the_run_write_outside_its_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "elsewhere.txt"
    os.symlink(target, out / "run.lock")
    directory = RunDirectory(out)
    try:
        directory.check_unused()
        with directory.claimed():
            pass
    except PrivfedError:
        return  # refused: the claim holds
    assert not target.exists()


def test_a_run_lock_that_is_a_link_is_never_opened_through(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "elsewhere.txt"
    os.symlink(target, out / "run.lock")
    with pytest.raises(PrivfedError, match=r"run\.lock is a link"), RunDirectory(out).claimed():
        pass
    assert not target.exists()


# --- 4. The stop rule ------------------------------------------------------------------------------------------------


def unusable(round_index: int) -> RoundReport:
    """A round with no usable reply, as the strategy reports it (no update_dropped: nothing was aggregated)."""
    reason = f"round {round_index}: no usable reply (2 failed, 0 rejected); the model is unchanged and the run stops"
    return RoundReport(round=round_index, completed=0, failures=2, seconds=0.1, server_stats={}, sampled_clients=(0, 1),
                       unusable=reason)


def test_a_run_that_never_applied_an_update_does_not_end_done_after_a_resume(tiny_config, tmp_path):
    driver = started(tiny_config.replace(rounds=5, checkpoint_every=1, out=str(tmp_path / "run")))
    for report_ in (dropped(0, None), dropped(1), dropped(2)):
        assert driver.on_round_end(report_) is None
    assert driver.on_round_end(unusable(3)) is not None
    first = driver.finish(secure_aggregation={"enabled": True})
    assert first["stop"]["cause"] == UNUSABLE_ROUND and train_exit_code(first) == FAILED_RUN_EXIT_CODE
    again = resumed(driver)  # "--resume can continue it once the cause is fixed"
    for report_ in (dropped(4), dropped(5)):
        again.on_round_end(report_)
    summary = again.finish(secure_aggregation={"enabled": True})  # rounds 1 to 5: no update applied
    assert summary["stop"] is not None and summary["stop"]["cause"] == NO_UPDATES
    assert train_exit_code(summary) == FAILED_RUN_EXIT_CODE


@pytest.mark.parametrize("rounds_run", [0, 2])
def test_a_run_whose_runtime_ended_having_applied_nothing_does_not_exit_0(tiny_config, tmp_path, rounds_run):
    driver = started(tiny_config.replace(rounds=5, out=str(tmp_path / "run")))
    driver.on_round_end(dropped(0, None))
    for round_index in range(1, rounds_run + 1):
        driver.on_round_end(dropped(round_index))
    summary = driver.finish(secure_aggregation={"enabled": True})
    assert summary["stop"] is not None  # runtime-ended
    assert train_exit_code(summary) != 0


def test_the_secagg_scales_never_grow_past_the_cap(tiny_config):
    """A client that raises its overflow flag every round grows every scale, but never past Q / 2."""
    quantization_range = 2**20
    cap = max_useful_scale(quantization_range)
    scales = np.ones(3)
    flags = np.ones(3, dtype=np.int64)
    for _ in range(40):
        scales = next_scales(scales, DecodedAggregate(mean=[], overflow_counts=flags, high_counts=flags), max_scale=cap)
    assert scales.max() == cap


def test_a_resume_whose_mechanism_now_plans_other_parameters_is_refused(tiny_config, tmp_path, monkeypatch):
    """An unset setting is recorded unset; the point keeps the plan's parameters, so a default that moved in an
    upgrade cannot change the run's min_k mid-run. A point written before they were kept resumes as before."""
    kanon = started(tiny_config.replace(rounds=3, checkpoint_every=1, out=str(tmp_path / "kanon")))
    kanon.on_round_end(report((0, kanon_release(8))))
    kanon.stop = Stop(INTERRUPTED, 0, "interrupted by SIGINT; stopped after round 0")
    kanon.finish(secure_aggregation={"enabled": False})
    assert read_resume_point(kanon.run_dir).mechanism_params == {"min_k": 5}
    from mechanisms.kanon import KAnonymousCentroids

    monkeypatch.setattr(KAnonymousCentroids, "settings", {"min_k": 6})  # an upgrade's new default
    with pytest.raises(PrivfedError, match=r"kanon now plans this run with \{'min_k': 6\}, not the \{'min_k': 5\}"):
        plan_resume(kanon.run_dir.path, {})
    path = kanon.run_dir.checkpoints / "resume.pt"
    older = {**torch.load(path, weights_only=True), "mechanism_params": None}
    torch.save(older, path)
    assert plan_resume(kanon.run_dir.path, {})[0].privacy.params == {"min_k": 6}
