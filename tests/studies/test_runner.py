"""A study runs every cell once: finished cells are skipped on a rerun, failed ones are recorded and retried.

The cells' work here is a small function, since what is checked is the
study's bookkeeping; training, evaluating and attacking are each tested
where they live.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from privfed.studies.grid import Study, settings_hash
from privfed.studies.runner import CELL_FILE, StaleCells, read_record, recorded_cells, run_study
from privfed.studies.tables import markdown_table, write_csv, write_markdown

STUDY = """
seeds = [0, 1]
[base]
dataset = "shapes:100"
[[grid]]
mechanism = ["reps", "kanon"]
"""


def load(tmp_path, text: str = STUDY) -> Study:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return Study.load(path)


class Work:
    """Records which cells ran; fails the cells it is told to."""

    def __init__(self, failing: set[str] = frozenset()) -> None:
        self.ran: list[str] = []
        self.failing = failing

    def __call__(self, cell, folder):
        self.ran.append(cell.run_name)
        if cell.run_name in self.failing:
            raise RuntimeError("no usable reply")
        (folder / "run").mkdir(parents=True, exist_ok=True)  # a rerun finds what a stopped one left
        return {"knn": 0.3 + 0.1 * cell.seed + (0.05 if cell.name == "mechanism-kanon" else 0.0), "k": 5}


def test_every_cell_runs_once_and_a_rerun_skips_the_finished_ones(tmp_path):
    study, out = load(tmp_path), tmp_path / "out"
    first = Work(failing={"mechanism-kanon-seed1"})
    records = run_study(study, out, first)
    assert first.ran == ["mechanism-reps-seed0", "mechanism-reps-seed1", "mechanism-kanon-seed0", "mechanism-kanon-seed1"]
    assert [r.finished for r in records] == [True, True, True, False]
    assert records[3].error == "RuntimeError: no usable reply"  # recorded, and the study went on
    again = Work()
    records = run_study(study, out, again)
    assert again.ran == ["mechanism-kanon-seed1"] and all(r.finished for r in records)  # only the failed cell again


def test_a_cell_stopped_mid_way_has_no_record_and_runs_again(tmp_path):
    study, out = load(tmp_path), tmp_path / "out"
    run_study(study, out, Work())
    (out / "cells" / "mechanism-reps-seed1" / CELL_FILE).unlink()  # as if killed before its work returned
    again = Work()
    run_study(study, out, again)
    assert again.ran == ["mechanism-reps-seed1"]
    assert read_record(out / "cells" / "mechanism-reps-seed1").finished


def test_progress_names_the_cell_what_is_done_and_an_estimate_of_what_is_left(tmp_path):
    lines: list[str] = []
    run_study(load(tmp_path), tmp_path / "out", Work(failing={"mechanism-reps-seed0"}), progress=lines.append)
    assert lines[0] == "[1/4] mechanism-reps-seed0 (0 done, 4 to run)"
    assert lines[1].startswith("  mechanism-reps-seed0 failed: RuntimeError")
    assert lines[2].startswith("[2/4] mechanism-reps-seed1 (1 done, 3 to run, about ") and lines[2].endswith(" left)")


def test_the_tables_hold_a_row_per_run_and_each_settings_mean_and_spread(tmp_path):
    records = run_study(load(tmp_path), tmp_path / "out", Work(failing={"mechanism-kanon-seed1"}))
    rows = write_csv(records, tmp_path / "results.csv").read_text().splitlines()
    assert rows[0] == "cell,seed,knn,k,error" and len(rows) == 5
    assert rows[4].startswith("mechanism-kanon,1,,,RuntimeError")
    table = markdown_table(records)
    assert "| mechanism-reps | 2 | 0.35 ± 0.071 (2) | 5 ± 0 (2) |" in table
    assert "| mechanism-kanon | 1 (1 failed) | 0.35 ± 0 (1) | 5 ± 0 (1) |" in table
    text = write_markdown(records, tmp_path / "results.md", title="privacy").read_text()
    assert "## Failed runs" in text and "mechanism-kanon seed 1: RuntimeError: no usable reply" in text


def test_a_record_is_whole_json(tmp_path):
    run_study(load(tmp_path), tmp_path / "out", Work())
    record = json.loads((tmp_path / "out" / "cells" / "mechanism-kanon-seed0" / CELL_FILE).read_text())
    assert record == {"name": "mechanism-kanon", "seed": 0, "row": {"knn": 0.35, "k": 5}, "error": None,
                      "seconds": record["seconds"], "config_hash": record["config_hash"], "settings": record["settings"],
                      "overrides": {"mechanism": "kanon"}}
    assert record["settings"]["train"]["mechanism"] == "kanon" and record["settings"]["train"]["dataset"] == "shapes:100"
    assert record["config_hash"] == settings_hash(record["settings"])


def test_a_stopped_study_reports_its_recorded_cells_in_study_order_and_says_it_is_partial(tmp_path):
    study, out = load(tmp_path), tmp_path / "out"
    run_study(study, out, Work(failing={"mechanism-kanon-seed0"}))
    (out / "cells" / "mechanism-reps-seed1" / CELL_FILE).unlink()  # stopped mid-cell
    records = recorded_cells(study, out)
    assert [(r.name, r.seed, r.finished) for r in records] == [
        ("mechanism-reps", 0, True), ("mechanism-kanon", 0, False), ("mechanism-kanon", 1, True)]
    text = write_markdown(records, tmp_path / "results.md", title="privacy", cells=4).read_text()
    assert "Partial: 3 of the study's 4 runs are recorded" in text
    assert "| mechanism-reps | 1 |" in text and "| mechanism-kanon | 1 (1 failed) |" in text
    whole = write_markdown(run_study(study, out, Work()), tmp_path / "done.md", title="privacy", cells=4).read_text()
    assert "Partial" not in whole


def test_an_unchanged_study_reuses_its_finished_cells(tmp_path):
    study, out = load(tmp_path), tmp_path / "out"
    run_study(study, out, Work())
    again = Work()
    records = run_study(load(tmp_path), out, again)  # the file read again, as a new `privfed study` would
    assert again.ran == [] and all(r.finished for r in records)


def test_a_changed_base_setting_is_refused_naming_the_cells_and_the_change(tmp_path):
    out = tmp_path / "out"
    run_study(load(tmp_path), out, Work())
    changed = Work()
    with pytest.raises(StaleCells) as refused:
        run_study(load(tmp_path, STUDY.replace('dataset = "shapes:100"', 'dataset = "shapes:100"\nrounds = 3')), out, changed)
    assert changed.ran == []  # refused before anything ran
    message = str(refused.value)
    assert "4 finished cell(s)" in message and "mechanism-reps-seed0: rounds: 12 -> 3" in message
    assert "--reuse-stale" in message and "delete its folder" in message


def test_reuse_stale_keeps_the_old_results_and_runs_only_new_cells(tmp_path):
    out = tmp_path / "out"
    old = run_study(load(tmp_path), out, Work())
    grown = STUDY.replace("seeds = [0, 1]", "seeds = [0, 1, 2]").replace('dataset = "shapes:100"', 'dataset = "shapes:100"\nrounds = 3')
    again, lines = Work(), []
    records = run_study(load(tmp_path, grown), out, again, reuse_stale=True, progress=lines.append)
    assert again.ran == ["mechanism-reps-seed2", "mechanism-kanon-seed2"]  # only the new seed's cells
    assert [r.row for r in records if r.seed < 2] == [r.row for r in old]
    assert lines[0].startswith("keeping 4 finished cell(s)")
    assert read_record(out / "cells" / "mechanism-reps-seed0").config_hash == old[0].config_hash  # not restamped


def test_a_cell_recorded_before_hashes_were_kept_is_stale_unknown(tmp_path):
    study, out = load(tmp_path), tmp_path / "out"
    run_study(study, out, Work())
    path = out / "cells" / "mechanism-kanon-seed1" / CELL_FILE
    values = json.loads(path.read_text())
    path.write_text(json.dumps({k: values[k] for k in ("name", "seed", "row", "error", "seconds")}))  # an old record
    with pytest.raises(StaleCells, match="mechanism-kanon-seed1: stale-unknown"):
        run_study(study, out, Work())
    again = Work()
    run_study(study, out, again, reuse_stale=True)
    assert again.ran == []


def test_a_cell_hashed_with_the_mechanism_options_every_run_wrote_before_is_not_stale(tmp_path):
    study, out = load(tmp_path), tmp_path / "out"
    run_study(study, out, Work())
    for cell in study.cells():  # as cells were hashed before these options were left unset unless given
        settings = study.cell_settings(cell)
        settings["train"].update(kanon_min_k=5, secret_sample=True)
        path = out / "cells" / f"{cell.name}-seed{cell.seed}" / CELL_FILE
        path.write_text(json.dumps({**json.loads(path.read_text()), "config_hash": settings_hash(settings)}))
    again = Work()
    run_study(study, out, again)
    assert again.ran == []
    settings["train"].update(kanon_min_k=7)  # a value no run wrote by default still counts as a change
    path.write_text(json.dumps({**json.loads(path.read_text()), "config_hash": settings_hash(settings)}))
    with pytest.raises(StaleCells):
        run_study(study, out, Work())


def test_a_stopped_attempt_under_another_configuration_is_started_again_not_resumed(tmp_path):
    out = tmp_path / "out"
    run_study(load(tmp_path), out, Work())
    folder = out / "cells" / "mechanism-reps-seed1"
    (folder / CELL_FILE).unlink()  # stopped mid-cell, its run left in the folder
    (folder / "run" / "leftover").write_text("a round of the old configuration")
    for cell in ("mechanism-reps-seed0", "mechanism-kanon-seed0", "mechanism-kanon-seed1"):
        (out / "cells" / cell / CELL_FILE).unlink()
    changed = STUDY.replace('dataset = "shapes:100"', 'dataset = "shapes:100"\nrounds = 3')
    run_study(load(tmp_path, changed), out, Work())
    assert not (folder / "run" / "leftover").exists()
    kept = Work()
    (folder / CELL_FILE).unlink()
    (folder / "run" / "leftover").write_text("a round of this configuration")
    run_study(load(tmp_path, changed), out, kept)
    assert kept.ran == ["mechanism-reps-seed1"] and (folder / "run" / "leftover").exists()  # same configuration: resumed


def test_the_configuration_hash_is_the_same_in_another_process(tmp_path):
    study = load(tmp_path)
    mine = [settings_hash(study.cell_settings(cell)) for cell in study.cells()]
    assert len(set(mine)) == 4  # one per cell
    code = ("import sys; from pathlib import Path; from privfed.studies.grid import Study, settings_hash; "
            "s = Study.load(Path(sys.argv[1])); print(' '.join(settings_hash(s.cell_settings(c)) for c in s.cells()))")
    for seed in ("1", "2"):  # str hashing differs between these processes
        other = subprocess.run([sys.executable, "-c", code, str(tmp_path / "study.toml")], capture_output=True, text=True,
                               check=True, env={**os.environ, "PYTHONHASHSEED": seed})
        assert other.stdout.split() == mine


def test_a_changed_attack_setting_makes_only_attacked_cells_stale(tmp_path):
    text = STUDY.replace("[[grid]]\nmechanism = [\"reps\", \"kanon\"]", "[[grid]]\nmethod = [\"orchestra\", \"simclr\"]")
    attacked = load(tmp_path, 'attack = "decoder"\n' + text)
    changed = load(tmp_path, 'attack = "decoder"\n' + text + "[attack_settings]\nsteps = 5\n")
    assert changed.attack_settings == {"steps": 5} and len(changed.cells()) == 4
    for before, after in zip(attacked.cells(), changed.cells()):
        same = settings_hash(attacked.cell_settings(before)) == settings_hash(changed.cell_settings(after))
        assert same == (before.config.release_mechanism is None), before.run_name  # simclr releases nothing


def test_a_damaged_attempt_is_one_of_unknown_configuration_and_the_cell_starts_again(tmp_path):
    """attempt.json only says what a stopped cell's leftovers were made with; damaged, they are not trusted."""
    study, out = load(tmp_path), tmp_path / "out"
    folder = out / "cells" / "mechanism-reps-seed0"
    (folder / "run").mkdir(parents=True)
    (folder / "attempt.json").write_bytes(b"\xff{")
    work = Work()
    records = run_study(study, out, work)
    assert work.ran[0] == "mechanism-reps-seed0" and all(r.finished for r in records)
    assert json.loads((folder / "attempt.json").read_text())["config_hash"] == records[0].config_hash
