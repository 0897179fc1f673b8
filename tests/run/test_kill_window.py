"""A run that dies at any write of a round's end, from its first charge to its resume point, resumes exactly.

The server writes a round's end in this order: its ledger charges, the
metrics line, the resume point. The run dies at each point in turn (a
``BaseException`` raised from the real write, which nothing in privfed
catches, so no summary is written: as after ``kill -9``), in round 2 of 3;
``--resume`` must then end with the metrics, model and ledgers of the run
left alone. A kill after the metrics line and before the point was refused
(issue 44, item 8). kanon, so the two runs release the same vectors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import privfed.run.observers.resume_point as resume_point
from privfed.config import build_config
from privfed.federation.simulation import simulate
from privfed.privacy.ledger import PrivacyLedger
from privfed.run.directory import RunDirectory
from privfed.run.interruption import signals_stop_runs
from privfed.run.plan import plan_resume, plan_run
from tests.run.test_resume import comparable, ctrl_c_after_round
from tests.run_records import jsonl, same

ROUNDS = 3
KILLED_ROUND = 2
#: Where round 2 dies. The kill that was refused runs by default; the others, which resumed before, are slow.
POINTS = [
    pytest.param(point, marks=() if point == "after its metrics line" else pytest.mark.slow, id=point)
    for point in ("before its first charge", "after its first charge", "before its metrics line",
                  "after its metrics line", "after its resume point")
]


class Killed(BaseException):
    """The process dies here."""


def configured(out: Path):
    return build_config(
        dataset="shapes:240", num_clients=3, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=ROUNDS, seed=3, device="cpu",
        mechanism="kanon", checkpoint_every=1, eval_every=ROUNDS, out=str(out),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run left alone, and the same run stopped by Ctrl-C after round 1."""
    folder = tmp_path_factory.mktemp("window")
    simulate(plan_run(configured(folder / "whole")))
    with signals_stop_runs():
        simulate(plan_run(configured(folder / "stopped")), ctrl_c_after_round(1))
    return folder


def dying_at(monkeypatch: pytest.MonkeyPatch, run: Path, point: str) -> None:
    """Makes the server die at ``point`` of round :data:`KILLED_ROUND` (each write made whole first, as a kill finds it)."""
    record, append_metrics, write_point = PrivacyLedger.record, RunDirectory.append_metrics, resume_point.write_resume_point

    def charging(ledger: PrivacyLedger, entry) -> None:
        ours = ledger.path == run / "ledger.jsonl" and entry.round == KILLED_ROUND  # not a client's own ledger
        if ours and point == "before its first charge":
            raise Killed
        record(ledger, entry)
        if ours and point == "after its first charge":
            raise Killed

    def logging(directory: RunDirectory, line: dict) -> None:
        if line["round"] == KILLED_ROUND and point == "before its metrics line":
            raise Killed
        append_metrics(directory, line)
        if line["round"] == KILLED_ROUND and point == "after its metrics line":
            raise Killed

    def pointing(directory: RunDirectory, resume_point) -> Path:
        path = write_point(directory, resume_point)
        if resume_point.round == KILLED_ROUND and point == "after its resume point":
            raise Killed
        return path

    monkeypatch.setattr(PrivacyLedger, "record", charging)
    monkeypatch.setattr(RunDirectory, "append_metrics", logging)
    monkeypatch.setattr(resume_point, "write_resume_point", pointing)


@pytest.mark.parametrize("point", POINTS)
def test_a_run_killed_at_each_write_of_a_rounds_end_resumes_to_the_uninterrupted_run(runs, tmp_path, point):
    run = tmp_path / "run"
    shutil.copytree(runs / "stopped", run)
    with pytest.MonkeyPatch.context() as patch:
        dying_at(patch, run, point)
        with pytest.raises(Killed):
            resume(run)
    assert not (run / "summary.json").exists()
    summary = resume(run)

    whole = runs / "whole"
    assert summary["rounds"] == ROUNDS and summary["stopped_early"] is None
    a, b = jsonl(whole / "metrics.jsonl"), jsonl(run / "metrics.jsonl")
    assert [m["round"] for m in b] == list(range(ROUNDS + 1))
    for x, y in zip(a, b):
        assert same(comparable(x), comparable(y)), (comparable(x), comparable(y))
    assert jsonl(whole / "ledger.jsonl") == jsonl(run / "ledger.jsonl")
    for own in sorted((whole / "client-ledgers").glob("*.jsonl")):
        assert jsonl(own) == jsonl(run / "client-ledgers" / own.name), own.name
    final_a = torch.load(whole / "checkpoints" / "final.pt", weights_only=True)
    final_b = torch.load(run / "checkpoints" / "final.pt", weights_only=True)
    for key, value in final_a["network"].items():
        assert torch.allclose(value.float(), final_b["network"][key].float(), atol=1e-5), key


def resume(run: Path) -> dict:
    """``privfed train --resume RUN``, in this process."""
    plan, resume_point = plan_resume(run, {})
    return simulate(plan, resume=resume_point)


def test_more_rounds_asked_by_a_resume_killed_before_its_next_point_are_kept(runs, tmp_path):
    """`--resume --rounds 4` records the rounds in config.json; a kill before its first resume point keeps them."""
    run = tmp_path / "run"
    shutil.copytree(runs / "stopped", run)
    plan, resume_point = plan_resume(run, {"rounds": ROUNDS + 1})
    with pytest.MonkeyPatch.context() as patch:
        dying_at(patch, run, "before its first charge")
        with pytest.raises(Killed):
            simulate(plan, resume=resume_point)
    assert json.loads((run / "config.json").read_text())["rounds"] == ROUNDS + 1
    plan, resume_point = plan_resume(run, {})
    assert plan.config.rounds == ROUNDS + 1 and resume_point.round == 1
