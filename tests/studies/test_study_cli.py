"""`privfed study` refuses a bad attack setting before any cell trains; `--report` tables what is recorded and runs nothing."""

from __future__ import annotations

import csv

from privfed.studies.grid import Study, settings_hash
from privfed.studies.runner import CellRecord, cell_folder, write_record

STUDY = """
attack = "decoder"

[attack_settings]
stepz = 5

[base]
dataset = "shapes:120"
rounds = 1
"""


def test_an_attack_setting_the_attack_does_not_take_fails_before_anything_trains(tmp_path, run_privfed):
    (tmp_path / "study.toml").write_text(STUDY)
    result = run_privfed("study", str(tmp_path / "study.toml"), "--out", str(tmp_path / "out"))
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output
    assert "[attack_settings] for decoder" in output and "stepz" in output
    assert not (tmp_path / "out" / "cells").exists()


GRID = """
seeds = [0, 1]
[base]
dataset = "shapes:120"
[[grid]]
mechanism = ["reps", "kanon"]
"""


def test_report_tables_the_recorded_runs_and_trains_nothing(tmp_path, run_privfed):
    (tmp_path / "study.toml").write_text(GRID)
    out = tmp_path / "out"
    empty = run_privfed("study", str(tmp_path / "study.toml"), "--out", str(out), "--report")
    assert empty.returncode != 0 and "no recorded run" in empty.stderr + empty.stdout
    cells = Study.load(tmp_path / "study.toml").cells()
    for cell, knn in zip(cells[:3], [0.30, 0.34, 0.40]):  # the last cell never ran
        write_record(cell_folder(out, cell), CellRecord(cell.name, cell.seed, {"knn": knn}, None, 1.0))
    result = run_privfed("study", str(tmp_path / "study.toml"), "--out", str(out), "--report")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "3 runs of the study's 4" in result.stdout
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["cell"], r["seed"], r["knn"]) for r in rows] == [
        ("mechanism-reps", "0", "0.3"), ("mechanism-reps", "1", "0.34"), ("mechanism-kanon", "0", "0.4")]
    text = (out / "results.md").read_text()
    assert "Partial: 3 of the study's 4 runs" in text and "| mechanism-reps | 2 | 0.32 ± 0.028 (2) |" in text
    assert not (cell_folder(out, cells[3])).exists()  # nothing ran


def test_a_changed_study_is_refused_and_reuse_stale_keeps_its_cells(tmp_path, run_privfed):
    """Every cell recorded as finished: the commands train nothing, so what is checked is the stale-cell rule."""
    study_file, out = tmp_path / "study.toml", tmp_path / "out"
    study_file.write_text(GRID)
    study = Study.load(study_file)
    for cell in study.cells():
        settings = study.cell_settings(cell)
        write_record(cell_folder(out, cell), CellRecord(cell.name, cell.seed, {"knn": 0.3 + cell.seed / 10}, None, 1.0,
                                                        settings_hash(settings), settings, cell.overrides))
    same = run_privfed("study", str(study_file), "--out", str(out))
    assert same.returncode == 0 and "4 runs, 0 failed" in same.stdout, same.stderr[-2000:]
    study_file.write_text(GRID.replace('dataset = "shapes:120"', 'dataset = "shapes:120"\nlr = 0.1'))
    refused = run_privfed("study", str(study_file), "--out", str(out))
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "mechanism-kanon-seed1: lr: 0.03 -> 0.1" in refused.stderr and "--reuse-stale" in refused.stderr
    for command in ("study", "tune"):
        kept = run_privfed(command, str(study_file), "--out", str(out), "--reuse-stale")
        assert kept.returncode == 0, kept.stderr[-2000:]
        assert "keeping 4 finished cell(s)" in kept.stdout
    assert [r["knn"] for r in csv.DictReader((out / "results.csv").open())] == ["0.3", "0.4", "0.3", "0.4"]


def test_a_study_whose_data_is_missing_stops_before_any_cell_and_says_how_to_get_it(tmp_path, run_privfed):
    result = run_privfed("study", "privacy-cpu-cifar10", "--out", str(tmp_path / "out"), "--data-dir", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--download" in result.stderr and "--dataset arrays:PATH" in result.stderr
    assert not (tmp_path / "out" / "cells").exists()


def test_dataset_on_the_command_line_replaces_the_studys(tmp_path, run_privfed):
    (tmp_path / "study.toml").write_text('[base]\ndataset = "cifar10"\nrounds = 1\n')
    missing = tmp_path / "nowhere.npz"
    result = run_privfed("study", str(tmp_path / "study.toml"), "--out", str(tmp_path / "out"),
                         "--dataset", f"arrays:{missing}")
    assert result.returncode == 2 and str(missing) in result.stderr  # the override is the data it looked for
    assert "image-arrays file not found" in result.stderr and "cifar-10-batches-py" not in result.stderr
