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


def test_statements_are_listed_per_setting_below_the_table_not_in_it():
    records = [record("ldp", 0, knn=0.2, statement="(1, 1e-3)-DP"), record("ldp", 1, knn=0.4, statement="(1, 1e-3)-DP"),
               record("reps", 0, knn=0.5, statement="No guarantee")]
    table = markdown_table(records)
    assert "DP" not in table and "statement" not in table and "| ldp | 2 | 0.3 ± 0.14 (2) |" in table
    assert prose_sections(records).splitlines()[-2:] == ["- **ldp**: (1, 1e-3)-DP", "- **reps**: No guarantee"]


def test_a_statement_that_differs_over_seeds_names_the_seeds_of_each():
    records = [record("kanon", seed, statement=f"at least {k} images") for seed, k in ((0, 5), (1, 6), (2, 5))]
    records.append(CellRecord("kanon", 3, None, "RuntimeError: x", 1.0))
    assert prose_sections(records).splitlines()[-2:] == ["- **kanon** (seeds 0, 2): at least 5 images",
                                                         "- **kanon** (seed 1): at least 6 images"]


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
