"""A run stopped by Ctrl-C and resumed ends exactly where the same run left alone ends: metrics, model, ledger.

The mechanism is kanon: a DP mechanism draws its noise from a secure source,
so no two runs of it, resumed or not, release the same vectors.
"""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
import torch

from privfed.config import build_config
from privfed.errors import PrivfedError
from privfed.federation.local_runtime import SIMULATED_RUN_KEY
from privfed.federation.simulation import simulate
from privfed.run.directory import RunDirectory
from privfed.run.interruption import signals_stop_runs
from privfed.run.plan import plan_resume, plan_run
from privfed.run.resume import read_resume_point
from tests.run_records import jsonl, same

ROUNDS = 4


def configured(out):
    return build_config(
        dataset="shapes:240", num_clients=3, participation=0.67, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=ROUNDS, seed=3, device="cpu",
        mechanism="kanon", checkpoint_every=0, out=str(out),
    )


def ctrl_c_after_round(stop_round: int):
    """Progress hook: the user presses Ctrl-C once round ``stop_round`` is logged."""

    def progress(event: dict) -> None:
        if event["event"] == "round" and event["round"] == stop_round:
            os.kill(os.getpid(), signal.SIGINT)

    return progress


def comparable(record: dict) -> dict:
    """A metrics line without wall-clock figures."""
    return {k: v for k, v in record.items() if not k.endswith("seconds")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    whole = simulate(plan_run(configured(folder / "whole")))
    with signals_stop_runs():  # as the CLI runs it: Ctrl-C stops after the round
        stopped = simulate(plan_run(configured(folder / "stopped")), ctrl_c_after_round(1))
    shutil.copytree(folder / "stopped", folder / "copy")  # for the refusals, before the resume changes it
    shutil.copytree(folder / "stopped", folder / "killed")
    point = read_resume_point(RunDirectory(folder / "stopped"))
    plan, point = plan_resume(folder / "stopped", {})
    resumed = simulate(plan, resume=point)
    return folder, whole, stopped, point, resumed


def test_the_stop_left_a_resume_point_at_its_last_round(runs):
    _, _, stopped, point, _ = runs
    assert stopped["stopped_early"].startswith("interrupted by SIGINT") and stopped["rounds"] < ROUNDS
    assert point.round == stopped["rounds"]


def test_the_resumed_run_ends_as_the_uninterrupted_one(runs):
    folder, whole, _, _, resumed = runs
    assert resumed["stopped_early"] is None and resumed["rounds"] == whole["rounds"] == ROUNDS
    a, b = jsonl(folder / "whole" / "metrics.jsonl"), jsonl(folder / "stopped" / "metrics.jsonl")
    assert [m["round"] for m in b] == list(range(ROUNDS + 1))
    for x, y in zip(a, b):
        assert same(comparable(x), comparable(y)), (comparable(x), comparable(y))
    assert resumed["knn_accuracy"] == pytest.approx(whole["knn_accuracy"], abs=1e-6)
    final_a = torch.load(folder / "whole" / "checkpoints" / "final.pt", weights_only=True)
    final_b = torch.load(folder / "stopped" / "checkpoints" / "final.pt", weights_only=True)
    for key, value in final_a["network"].items():
        assert torch.allclose(value.float(), final_b["network"][key].float(), atol=1e-5), key
    assert torch.allclose(final_a["centroids"], final_b["centroids"], atol=1e-5)


def test_the_ledger_after_resume_is_the_uninterrupted_ledger(runs):
    folder, whole, _, _, resumed = runs
    assert jsonl(folder / "whole" / "ledger.jsonl") == jsonl(folder / "stopped" / "ledger.jsonl")
    assert resumed["privacy"]["k"] == whole["privacy"]["k"] is not None


def test_a_finished_run_or_another_change_is_refused(runs):
    folder = runs[0]
    with pytest.raises(PrivfedError, match="already finished round 4 of 4"):
        plan_resume(folder / "whole", {})
    with pytest.raises(PrivfedError, match="cannot change seed"):
        plan_resume(folder / "whole", {"seed": 9, "rounds": None})
    assert plan_resume(folder / "whole", {"rounds": 6})[1].round == ROUNDS  # kanon has no budget to stretch


def test_a_resume_writes_to_the_directory_named_whatever_out_it_recorded(runs):
    copy = runs[0] / "copy"
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "out": "runs/somewhere-relative"}))
    plan, point = plan_resume(copy, {})
    assert plan.config.out == str(copy.resolve()) and point.round >= 1


def test_a_resume_point_ahead_of_the_runs_log_is_refused(runs):
    copy = runs[0] / "copy"
    metrics = (copy / "metrics.jsonl").read_text().splitlines()
    (copy / "metrics.jsonl").write_text(metrics[0] + "\n")  # the log ends at round 0, the point is later
    with pytest.raises(PrivfedError, match="is not this run's"):
        plan_resume(copy, {})


def test_the_clients_see_one_run_before_and_after_the_resume(runs):
    """Flower draws a new run id per process; the clients' guards must see the resumed run as the same run,
    or a client would answer again a round it answered before a kill."""
    folder = runs[0]
    entries = [json.loads(line) for path in (folder / "stopped" / "client-ledgers").glob("*.jsonl")
               for line in path.read_text().splitlines()]
    assert entries and {entry["run"] for entry in entries} == {SIMULATED_RUN_KEY}


def test_a_kill_between_a_rounds_charges_and_its_log_resumes_and_charges_the_round_once(runs):
    """The server charges round r, then is killed before r's metrics line and resume point: resuming replays r.

    Built from the stopped run: its summary removed (a kill writes none) and the
    ledger lines the uninterrupted run charged for the next round appended.
    Charges two rounds past the point are still refused.
    """
    folder, _, stopped, _, _ = runs
    killed, further = folder / "killed", folder / "further"
    (killed / "summary.json").unlink()
    next_round = stopped["rounds"] + 1
    charged = [e for e in jsonl(folder / "whole" / "ledger.jsonl") if e["round"] == next_round]
    assert charged
    shutil.copytree(killed, further)
    for run_dir, rounds in ((killed, [next_round]), (further, [next_round, next_round + 1])):
        with open(run_dir / "ledger.jsonl", "a") as fh:
            fh.writelines(json.dumps({**entry, "round": r}) + "\n" for r in rounds for entry in charged)
    with pytest.raises(PrivfedError, match=f"ran round {next_round + 1} after its last resume point"):
        plan_resume(further, {})
    plan, point = plan_resume(killed, {})
    assert point.round == stopped["rounds"]
    simulate(plan, resume=point)
    assert jsonl(killed / "ledger.jsonl") == jsonl(folder / "whole" / "ledger.jsonl")
