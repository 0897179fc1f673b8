"""A study's results: the tables and plots written from its records, and tune's ranking beside them."""

from __future__ import annotations

from privfed.studies.grid import Study
from privfed.studies.results import TUNING_FILE, write_results, write_tuning
from privfed.studies.runner import CellRecord
from privfed.studies.tables import tuning_ranking

GRID = """
seeds = [0, 1]
[base]
dataset = "shapes:120"
[[grid]]
lr = [0.1, 0.01]
"""


def load(tmp_path) -> Study:
    (tmp_path / "grid.toml").write_text(GRID)
    return Study.load(tmp_path / "grid.toml")


def row(score: float, linear: float) -> dict[str, float]:
    return {"knn": linear, "linear": linear, "alignment": score, "uniformity": 0.0, "tuning_score": score}


def test_the_results_of_some_cells_name_their_files_and_count_the_failed_ones(tmp_path):
    study = load(tmp_path)
    first, second = study.cells()[:2]
    records = [CellRecord(first.name, first.seed, row(0.5, 0.3), None, 1.0),
               CellRecord(second.name, second.seed, None, "RuntimeError: the run stopped", 1.0)]
    result = write_results(study, tmp_path, records, name="grid")
    assert (result.folder, result.records, result.cells, result.failed) == (tmp_path, tuple(records), 4, 1)
    assert result.written[:2] == (tmp_path / "results.csv", tmp_path / "results.md")
    assert all(path.is_file() for path in result.written)
    text = (tmp_path / "results.md").read_text()
    assert text.startswith("# Study grid\n") and "Partial: 2 of the study's 4 runs" in text
    assert "the run stopped" in text


def test_no_record_writes_nothing(tmp_path):
    study = load(tmp_path)
    result = write_results(study, tmp_path, [], name="grid")
    assert (result.records, result.cells, result.written) == ((), 4, ())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["grid.toml"]


def test_tuning_writes_the_ranking_beside_the_tables_best_score_first(tmp_path):
    study = load(tmp_path)
    cells = study.cells()
    scores = {"lr-0.1": 0.4, "lr-0.01": 0.7}
    records = [CellRecord(c.name, c.seed, row(scores[c.name] + c.seed / 100, 0.2), None, 1.0) for c in cells]
    tuned = write_tuning(write_results(study, tmp_path, records, name="grid"), name="grid")
    assert tuned.path == tmp_path / TUNING_FILE and tuned.ranking == tuning_ranking(records)
    assert tuned.path.read_text() == (
        "# Tuning grid\n\nHigher score first; the accuracy is for comparison only (it needs labels).\n\n" + tuned.ranking
    )
    ranked = [line.split(" | ")[1] for line in tuned.ranking.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert ranked == ["lr-0.01", "lr-0.1"] and tuned.study.records == tuple(records)
