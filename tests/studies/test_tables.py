"""A study's tables: mean ± std over seeds, failures counted, and the tuning ranking."""

from __future__ import annotations

import pytest

from privfed.studies.runner import CellRecord
from privfed.studies.tables import markdown_table, prose_sections, summarise, tuning_ranking


def record(name: str, seed: int, **row) -> CellRecord:
    return CellRecord(name, seed, row, None, 1.0)


def test_a_setting_is_summarised_over_its_seeds_and_failures_are_counted():
    records = [record("a", 0, knn=0.2), record("a", 1, knn=0.4), CellRecord("a", 2, None, "RuntimeError: x", 1.0)]
    table = markdown_table(records)
    assert "| a | 2 (1 failed) | 0.3 ± 0.14 (2) |" in table
    assert summarise(["kanon", "kanon"]) == "kanon" and summarise([None]) == "-"


def statement(headline: str, **more) -> dict:
    """A row's privacy columns, as :func:`privfed.studies.cell_work.study_row` takes them from summary.json."""
    return {"statement": headline, "covers": ["updates: DP-SGD"], "not_covered": ["sizes"],
            "privacy_details": "docs/privacy.md#statement-dp-releases", **more}


def test_each_distinct_statement_is_listed_once_below_the_table_with_the_settings_it_applies_to():
    shared = statement("(1, 1e-3)-DP")
    records = [record("ldp", 0, knn=0.2, **shared), record("ldp", 1, knn=0.4, **shared),
               record("ldp-wide", 0, knn=0.3, **shared), record("reps", 0, knn=0.5, **statement("No guarantee"))]
    table = markdown_table(records)
    assert "DP" not in table and "statement" not in table and "covers" not in table
    assert "| ldp | 2 | 0.3 ± 0.14 (2) |" in table
    prose = prose_sections(records)
    assert prose.count("(1, 1e-3)-DP") == 1 and prose.count("No guarantee") == 1 and prose.count("- Covers:") == 2
    assert "Applies to **ldp**, **ldp-wide**.\n\n> (1, 1e-3)-DP\n" in prose
    assert "- Covers:\n  - updates: DP-SGD\n- Not covered:\n  - sizes\n" in prose
    assert "`docs/privacy.md#statement-dp-releases`" in prose
    assert prose.index("Statement 1") < prose.index("(1, 1e-3)-DP") < prose.index("Statement 2") < prose.index("No guarantee")


def test_a_statement_that_differs_over_seeds_names_the_seeds_of_each():
    records = [record("kanon", seed, **statement(f"at least {k} images")) for seed, k in ((0, 5), (1, 6), (2, 5))]
    records.append(CellRecord("kanon", 3, None, "RuntimeError: x", 1.0))
    prose = prose_sections(records)
    assert "Applies to **kanon** (seeds 0, 2).\n\n> at least 5 images" in prose
    assert "Applies to **kanon** (seed 1).\n\n> at least 6 images" in prose


def test_runs_with_the_same_headline_but_other_lists_are_separate_statements():
    records = [record("a", 0, **statement("h")), record("b", 0, **statement("h", not_covered=["sizes", "labels"]))]
    prose = prose_sections(records)
    assert "Applies to **a**." in prose and "Applies to **b**." in prose and "Statement 2" in prose


def test_a_study_recorded_before_headlines_lists_its_long_statement_once_too():
    records = [record("ldp", seed, statement="the long text") for seed in (0, 1, 2)]
    prose = prose_sections(records)
    assert prose.count("the long text") == 1 and "Applies to **ldp**." in prose and "Covers" not in prose


def test_the_csv_joins_a_statements_lists(tmp_path):
    from privfed.studies.tables import write_csv

    rows = write_csv([record("a", 0, **statement("h", not_covered=["sizes", "labels"]))], tmp_path / "r.csv")
    assert "sizes; labels" in rows.read_text() and "[" not in rows.read_text()


def test_tuning_ranks_by_the_score_and_reports_how_well_it_agrees_with_labels():
    scores_and_accuracy = {"lr-0.1": (0.9, 0.30), "lr-0.03": (0.7, 0.40), "lr-0.01": (0.5, 0.35), "lr-0.003": (0.1, 0.2)}
    records = [record(name, seed, tuning_score=score + seed / 100, linear=acc)
               for name, (score, acc) in scores_and_accuracy.items() for seed in (0, 1)]
    ranking = tuning_ranking(records)
    lines = [line for line in ranking.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [line.split(" | ")[1] for line in lines] == ["lr-0.1", "lr-0.03", "lr-0.01", "lr-0.003"]
    # Ranks by score 1,2,3,4 against ranks by accuracy 3,1,2,4: rho = 1 - 6*(4+1+1+0)/(4*15) = 0.4.
    assert "Spearman rank correlation of score and linear accuracy over 4 settings: 0.40" in ranking


def test_the_ranking_shows_the_scores_parts_so_a_collapsed_encoder_is_visible():
    # Collapse: every image at one point gives alignment 1 and uniformity 0, the score 1.0, ahead of a spread encoder.
    records = [record("collapsed", 0, tuning_score=1.0, alignment=1.0, uniformity=0.0, linear=0.1),
               record("spread", 0, tuning_score=0.7, alignment=0.6, uniformity=0.5, linear=0.4)]
    ranking = tuning_ranking(records)
    assert "| 1 | collapsed | 1 ± 0 (1) | 1 ± 0 (1) | 0 ± 0 (1) | 0.1 ± 0 (1) |" in ranking
    assert "| 2 | spread | 0.7 ± 0 (1) | 0.6 ± 0 (1) | 0.5 ± 0 (1) | 0.4 ± 0 (1) |" in ranking
    assert "collapsed encoder" in ranking


@pytest.mark.parametrize("count", [1, 2])
def test_too_few_settings_give_no_correlation(count):
    records = [record(f"s{i}", 0, tuning_score=float(i), linear=0.1) for i in range(count)]
    assert "Spearman" not in tuning_ranking(records)


def test_a_setting_without_a_finite_score_is_listed_not_ranked():
    records = [record("lr-0.1", 0, tuning_score=float("nan"), linear=0.1), record("lr-0.01", 0, tuning_score=0.4, linear=0.3)]
    ranking = tuning_ranking(records)
    assert "| 1 | lr-0.01 |" in ranking and "| 2 |" not in ranking
    assert "Not scored (no finite score, e.g. a diverged run): lr-0.1" in ranking
