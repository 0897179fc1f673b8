"""Running a study file: every check before the first cell, the results written however it ends.

No cell trains here (a study that trains is tests/test_api.py's and
tests/studies/test_study_end_to_end.py's): finished cells are recorded
beforehand, and a Ctrl-C arrives from a cell's progress callback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from privfed.errors import PrivfedError
from privfed.studies.grid import Study, settings_hash
from privfed.studies.orchestration import report_study_file, run_study_file, study_folder
from privfed.studies.results import StudyStopped
from privfed.studies.runner import CellRecord, cell_folder, write_record

STUDY = """
seeds = [0, 1]
[base]
dataset = "shapes:120"
num_clients = 3
rounds = 1
device = "cpu"
[[grid]]
mechanism = ["reps", "kanon"]
"""


def load(tmp_path, text: str = STUDY) -> tuple[Study, Path]:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return Study.load(path), path


def record_finished(study: Study, out: Path, count: int) -> None:
    """Records the study's first ``count`` cells as finished under the study's settings now."""
    for cell in study.cells()[:count]:
        settings = study.cell_settings(cell)
        write_record(cell_folder(out, cell), CellRecord(cell.name, cell.seed, {"knn": 0.3 + cell.seed / 10}, None, 1.0,
                                                        settings_hash(settings), settings, cell.overrides))


def test_the_study_directory_is_out_or_studies_and_the_files_name():
    assert study_folder("privacy-cpu-cifar10", None) == Path("studies/privacy-cpu-cifar10")
    assert study_folder(Path("configs/grid.toml"), None) == Path("studies/grid")
    assert study_folder("grid.toml", "elsewhere") == Path("elsewhere")


def test_a_study_whose_cells_all_finished_runs_none_and_writes_its_tables(tmp_path):
    study, path = load(tmp_path)
    out = tmp_path / "out"
    record_finished(study, out, 4)
    lines: list[str] = []
    started: list[str] = []
    result = run_study_file(study, path, out, log=lines.append, run_progress=started.append)
    assert lines == [] and started == []
    assert (result.folder, result.cells, len(result.records), result.failed) == (out, 4, 4, 0)
    assert [p.name for p in result.written][:2] == ["results.csv", "results.md"]
    assert (out / "results.md").read_text().startswith("# Study study\n")


def test_ctrl_c_in_a_cell_stops_the_study_after_writing_the_results_so_far(tmp_path):
    study, path = load(tmp_path)
    out = tmp_path / "out"
    record_finished(study, out, 1)
    lines: list[str] = []

    def interrupted(name: str) -> None:
        raise KeyboardInterrupt(f"{name}: Ctrl-C")

    with pytest.raises(StudyStopped, match="mechanism-reps-seed1: Ctrl-C") as stopped:
        run_study_file(study, path, out, log=lines.append, run_progress=interrupted)
    assert lines == ["[2/4] mechanism-reps-seed1 (1 done, 3 to run)"]
    result = stopped.value.result
    assert (result.cells, [r.seed for r in result.records]) == (4, [0])
    assert "Partial: 1 of the study's 4 runs" in (out / "results.md").read_text()
    assert not (cell_folder(out, study.cells()[1]) / "cell.json").exists()


def test_missing_data_stops_the_study_before_its_directory_is_made(tmp_path):
    study, path = load(tmp_path, STUDY.replace('"shapes:120"', f'"arrays:{tmp_path / "nowhere.npz"}"'))
    with pytest.raises(PrivfedError, match="image-arrays file not found"):
        run_study_file(study, path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_cell_that_cannot_run_stops_the_study_before_any_trains(tmp_path):
    study, path = load(tmp_path, STUDY.replace('["reps", "kanon"]', '["reps", "ldp"]'))
    with pytest.raises(PrivfedError, match="cell mechanism-ldp-seed0"):
        run_study_file(study, path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_report_needs_a_recorded_cell_and_names_the_study_as_given(tmp_path):
    study, path = load(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(PrivfedError, match=f"{out} holds no recorded run of {path}; run the study first"):
        report_study_file(study, path, out)
    record_finished(study, out, 3)
    result = report_study_file(study, path, out)
    assert (result.cells, len(result.records)) == (4, 3)
    assert "Partial: 3 of the study's 4 runs" in (out / "results.md").read_text()
