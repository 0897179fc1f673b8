"""The attack figures a study row takes from ``attack.json``, for every kind of release; and which stopped runs it refuses."""

from __future__ import annotations

import pytest

import privfed.studies.cell_work as cell_work
from attacks.scoring.report import summarize
from privfed.config import build_config
from privfed.studies.cell_work import StudyInterrupted, attack_figures, study_row
from privfed.studies.grid import Cell


def scored(kind: str, value: float, null: float) -> dict[str, float]:
    return {f"psnr_{kind}": value, f"null_psnr_{kind}": null, "psnr_best_client": value, "null_psnr_best_client": null}


@pytest.mark.parametrize("kind", ["source", "best_member"])
def test_reps_is_scored_against_its_source_and_centroids_against_their_best_member(kind):
    """reps vectors have one member (their source), centroids several: both give the study a figure."""
    round_result = summarize([scored(kind, 14.0, 12.0), scored(kind, 15.0, 12.0)])
    assert attack_figures(round_result) == {"attack_advantage_psnr": pytest.approx(2.5),
                                            "attack_advantage_psnr_client": pytest.approx(2.5),
                                            "attack_vectors": 2, "attack_member_vectors": 2}


def test_a_dp_release_has_only_the_client_figure():
    """A DP release cannot be replayed, so its members are unknown: None for the member figure, not another score."""
    round_result = summarize([{"psnr_best_client": 14.0, "null_psnr_best_client": 13.0}])
    assert attack_figures(round_result) == {"attack_advantage_psnr": None, "attack_advantage_psnr_client": 1.0,
                                            "attack_vectors": 1, "attack_member_vectors": 0}


def test_the_member_figure_says_how_many_vectors_it_averages():
    """A client whose replay differed has no known members: the member figure covers fewer vectors than the client one."""
    round_result = summarize([scored("best_member", 20.0, 12.0), {"psnr_best_client": 12.0, "null_psnr_best_client": 13.0}])
    figures = attack_figures(round_result)
    assert figures["attack_advantage_psnr"] == pytest.approx(8.0) and figures["attack_member_vectors"] == 1
    assert figures["attack_advantage_psnr_client"] == pytest.approx(3.5) and figures["attack_vectors"] == 2


@pytest.mark.parametrize(
    ("cause", "message", "raised"),
    [
        ("no-updates", "rounds 1 to 3 applied no model update (secure aggregation halted)", RuntimeError),
        ("unusable-round", "round 1: no usable reply", RuntimeError),
        ("interrupted", "interrupted by SIGINT; stopped after round 1", StudyInterrupted),
    ],
)
def test_a_cell_whose_run_trained_nothing_or_was_interrupted_is_no_result(monkeypatch, tmp_path, cause, message, raised):
    """Decided on the summary's stop cause: a run that applied no update was scored as a result before."""
    summary = {"stop": {"cause": cause, "round": 3, "message": message}, "stopped_early": message}
    monkeypatch.setattr(cell_work, "train_cell", lambda *args, **kwargs: summary)
    cell = Cell("cell", {}, 0, build_config(dataset="shapes:300", num_clients=4))
    with pytest.raises(raised, match=message.split(" (")[0]):
        study_row(cell, tmp_path, attack_method=None, attack=None)
