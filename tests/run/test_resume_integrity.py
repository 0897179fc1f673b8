"""A run folder proves its own history: a resume refuses a changed configuration or ledger, a new run a used folder.

Each refusal is one line naming the file, exit status 2, and nothing in the
folder written or changed. The runs are real and short: an ``ldp`` run, where
the ledger is what the run's ε is read from, stopped by Ctrl-C after round 1
of 2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from privfed.cli import main
from privfed.config import RUN_ID_KEY, build_config
from privfed.federation.simulation import simulate
from privfed.run.directory import RunDirectory
from privfed.run.interruption import signals_stop_runs
from privfed.run.plan import plan_run
from privfed.run.resume import read_resume_point, write_resume_point
from tests.run.test_resume import ctrl_c_after_round


def configured(out: Path):
    return build_config(
        dataset="shapes:300", num_clients=4, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=2, seed=1, device="cpu",
        mechanism="ldp", epsilon=5.0, out=str(out),
    )


def stopped_run(out: Path) -> None:
    with signals_stop_runs():  # as the CLI runs it: Ctrl-C stops after the round
        summary = simulate(plan_run(configured(out)), ctrl_c_after_round(1))
    assert summary["rounds"] == 1 and summary["stopped_early"].startswith("interrupted")


# runs, run and no_training: tests/run/conftest.py


def files(folder: Path) -> dict[str, bytes]:
    """Every file's bytes (the lock file aside, which claiming the folder opens)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "run.lock"}


def refused(argv: list[str], folder: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Runs ``privfed`` and returns its one error line, after checking the exit status and that ``folder`` is untouched."""
    before = files(folder)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert files(folder) == before
    return lines[0]


def resume_refused(run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    return refused(["train", "--resume", str(run)], run, capsys)


def client_ledger(run: Path) -> Path:
    return sorted((run / "client-ledgers").glob("*.jsonl"))[0]


def test_a_deleted_server_ledger_is_refused(run, no_training, capsys):
    (run / "ledger.jsonl").unlink()
    line = resume_refused(run, capsys)
    assert f"{run / 'ledger.jsonl'} is gone" in line and "budget already spent is unknown" in line


def test_a_server_ledger_cut_to_its_first_line_is_refused(run, no_training, capsys):
    ledger = run / "ledger.jsonl"
    lines = ledger.read_text().splitlines(keepends=True)
    assert len(lines) == 8  # 4 clients, rounds 0 and 1
    ledger.write_text(lines[0])
    line = resume_refused(run, capsys)
    assert f"{ledger} has 1 entry, the resume point recorded 8" in line


def test_an_edited_server_ledger_entry_is_refused(run, no_training, capsys):
    ledger = run / "ledger.jsonl"
    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    params = entries[5]["events"][0]["params"]
    noise = next(name for name in params if name != "count")
    params[noise] *= 10  # ten times the noise: a smaller cost
    ledger.write_text("".join(json.dumps(e) + "\n" for e in entries))
    line = resume_refused(run, capsys)
    assert f"{ledger}'s first 8 entries are not those the resume point recorded" in line


def test_a_server_ledger_charge_of_an_earlier_round_appended_is_refused(run, no_training, capsys):
    ledger = run / "ledger.jsonl"
    first = ledger.read_text().splitlines()[0]
    with open(ledger, "a") as fh:
        fh.write(first.replace('"client": 0', '"client": 9') + "\n")
    line = resume_refused(run, capsys)
    assert f"{ledger} charges round 0 after the entries its resume point (round 1) recorded" in line


def test_a_deleted_client_ledger_is_refused(run, no_training, capsys):
    ledger = client_ledger(run)
    ledger.unlink()
    assert f"{ledger} is gone, but the resume point recorded 2 entries in it" in resume_refused(run, capsys)


@pytest.mark.parametrize("damage", ["bad-json", "cut-line", "not-utf8"])
def test_a_damaged_client_ledger_is_one_line(run, no_training, capsys, damage):
    ledger = client_ledger(run)
    data = ledger.read_bytes()
    if damage == "bad-json":
        ledger.write_bytes(data + b"{oops\n")
    elif damage == "cut-line":
        ledger.write_bytes(data[: len(data) - 10])
    else:
        ledger.write_bytes(b"\xff\xfe" + data[2:])
    line = resume_refused(run, capsys)
    assert str(ledger) in line and "budget already spent is unknown" in line


@pytest.mark.parametrize("edit", [
    {"mechanism": "kanon", "epsilon": None}, {"mechanism": "reps", "epsilon": None}, {"dataset": "shapes:400"},
    {"num_global_centroids": 6}, {"epsilon": 50.0},
], ids=lambda edit: "-".join(f"{k}={v}" for k, v in edit.items()))
def test_an_edited_config_is_refused(run, no_training, capsys, edit):
    path = run / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, **edit}))
    line = resume_refused(run, capsys)
    assert f"{path} was changed after the run's last resume point ({', '.join(sorted(edit))})" in line


def test_a_resume_point_of_another_run_of_the_same_configuration_and_ledgers_is_refused(run, tmp_path, no_training,
                                                                                       capsys):
    """Another run with this run's configuration and seed charges the same ledgers; its run id tells them apart."""
    other = tmp_path / "other"
    shutil.copytree(run, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, RUN_ID_KEY: "0" * 32}))
    directory = RunDirectory(other)
    write_resume_point(directory, read_resume_point(directory))  # as that run would have written it
    shutil.copy(other / "checkpoints" / "resume.pt", run / "checkpoints" / "resume.pt")
    line = resume_refused(run, capsys)
    assert "belongs to another run" in line and "the point is not this run's" in line


def test_a_resume_point_without_the_binding_is_refused(run, no_training, capsys):
    point = run / "checkpoints" / "resume.pt"
    payload = torch.load(point, weights_only=True)
    torch.save({k: v for k, v in payload.items() if k not in ("config", "ledgers")}, point)
    assert "does not record the run's configuration and ledgers" in resume_refused(run, capsys)


def test_a_resume_point_with_a_malformed_binding_is_refused(run, no_training, capsys):
    point = run / "checkpoints" / "resume.pt"
    payload = torch.load(point, weights_only=True)
    torch.save({**payload, "ledgers": {"ledger.jsonl": {"entries": "8"}}}, point)
    assert f"cannot read {point}: it is damaged" in resume_refused(run, capsys)


def test_train_into_a_used_folder_without_config_json_is_refused(runs, tmp_path, no_training, capsys):
    used = tmp_path / "used"
    shutil.copytree(runs / "stopped", used)
    (used / "config.json").unlink()
    line = refused(["train", "--dataset", "shapes:300", "--num-clients", "4", "--rounds", "1", "--device", "cpu",
                    "--out", str(used)], used, capsys)
    assert f"{used} holds files but no privfed run" in line and "choose another --out" in line


def test_train_into_an_empty_folder_is_accepted(tmp_path):
    (tmp_path / "empty").mkdir()
    plan = plan_run(configured(tmp_path / "empty"))
    assert plan.run_dir.path == tmp_path / "empty"


def test_config_json_records_a_random_run_id(runs, tmp_path):
    RunDirectory(tmp_path / "new").create(configured(tmp_path / "new"))
    ids = {json.loads((folder / "config.json").read_text())[RUN_ID_KEY] for folder in (runs / "stopped", tmp_path / "new")}
    assert len(ids) == 2 and all(len(i) == 32 for i in ids)
