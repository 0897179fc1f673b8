"""``benchmarks/gpu/check.py``: its sizes, its projection to the paper's run, and the whole check at a toy size on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.benchmarks.scripts import load_script

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check():
    return load_script("gpu_check", REPO / "benchmarks" / "gpu" / "check.py")


def test_the_gpu_sizes_fit_the_check_and_any_one_can_be_overridden(check):
    gpu = check.settings({})  # 16 clients per round in the train part: SecAgg+ at 50 would take the budget
    assert (gpu.device, gpu.clients, gpu.rounds, gpu.batches, gpu.runtime_args) == ("cuda", 32, 1, "16 256", "--runtime local")
    assert gpu.parts.split() == ["env", "step", "cohort", "train", "presets"]
    assert "--clients-per-step 0" in gpu.train_args and gpu.preset == "gpu-cifar10-dev"
    assert gpu.methods.split()[:2] == ["orchestra", "rotpred"]
    assert "--clients 1 8 16 50" in gpu.cohort_args
    assert gpu.dataset.endswith(".gpu-wheelhouse/data/cifar10-dev.npz")
    install, kill_after = 20, 15  # check.sh: 540 s in all, the install included
    assert sum(gpu.budgets.values()) <= 540 - install - kill_after
    toy = check.settings({"GPU_CHECK_TOY": "1", "GPU_CHECK_ROUNDS": "2", "GPU_CHECK_BUDGET_TRAIN": "5",
                          "GPU_CHECK_RUNTIME_ARGS": "", "GPU_CHECK_EVALUATE_S": "12.5", "GPU_CHECK_PARTS": "cohort presets"})
    assert (toy.device, toy.clients, toy.rounds, toy.budgets["train"], toy.runtime_args) == ("cpu", 3, 2, 5.0, "")
    assert toy.evaluate_s == 12.5 and toy.parts == "cohort presets"
    assert sum(toy.budgets.values()) <= 900 - kill_after  # the toy size's total (no install)


def test_an_unknown_part_is_refused(check):
    with pytest.raises(ValueError, match="attack"):
        check.settings({"GPU_CHECK_PARTS": "env attack"})


def test_an_epoch_drops_a_trailing_batch_of_one(check):
    assert [check.client_steps(n, 16) for n in (0, 1, 2, 16, 17, 18, 500)] == [0, 0, 1, 1, 1, 2, 32]
    assert [check.samples_per_epoch(n, 16) for n in (1, 2, 17, 18)] == [0, 2, 16, 18]


ROUNDS = [
    {"round": 0, "wall_s": 12.0, "clients": 16, "knn": None, "train_s": 0.0, "secagg_s": 0.0, "knn_s": 2.0, "rest_s": 10.0},
    {"round": 1, "wall_s": 50.0, "clients": 16, "knn": None, "samples": 8000, "train_s": 4.0, "secagg_s": 32.0,
     "knn_s": 0.0, "rest_s": 14.0},
    {"round": 2, "wall_s": 60.0, "clients": 16, "knn": 0.3, "samples": 8000, "train_s": 4.0, "secagg_s": 40.0,
     "knn_s": 1.0, "rest_s": 15.0},
]


def test_the_projection_takes_training_from_the_batched_rate_and_secagg_and_the_rest_per_client(check):
    projected = check.paper_projection(ROUNDS, images_here=6000, batched_samples_per_s=5000.0)
    assert projected["training_from"] == "cohort part"
    assert projected["train_s_per_round"] == pytest.approx(50 * 10 * 500 / 5000)  # 50 s
    assert projected["train_s_per_round_as_run"] == pytest.approx(250_000 * 4.0 / 8000)  # 125 s
    assert projected["secagg_s_per_round"] == pytest.approx(50 * 36.0 / 16)  # the median of 2.0 and 2.5 s a client
    assert projected["rest_s_per_round"] == pytest.approx(50 * 14.5 / 16)
    knn = 1.5 * 60_000 / 6000  # the median kNN, scaled to CIFAR-10
    assert projected["knn_eval_s"] == pytest.approx(knn)
    assert projected["round0_s"] == pytest.approx(10.0 * 50 / 16 + knn)
    round_s = 50 + 50 * 36.0 / 16 + 50 * 14.5 / 16
    total = projected["round0_s"] + 100 * round_s + 10 * knn
    assert projected["run_hours"] * 3600 == pytest.approx(total)
    assert sum(projected["shares"].values()) == pytest.approx(1.0)


def test_without_the_cohort_figures_the_projection_trains_at_this_runs_rate(check):
    projected = check.paper_projection(ROUNDS, images_here=6000)
    assert projected["training_from"] == "this run"
    assert projected["train_s_per_round"] == projected["train_s_per_round_as_run"] == pytest.approx(125.0)
    with pytest.raises(ValueError, match="no training round"):
        check.paper_projection(ROUNDS[:1], images_here=6000)


@pytest.mark.parametrize(("ends", "stop"), [
    ([], False),  # nothing logged yet
    ([40.0], False),  # round 1 ends ~80, round 2 ~120: fits 150 with 8 s to finish
    ([60.0], True),  # round 1 ends ~120, round 2 would end ~180
    ([40.0, 70.0], False),  # 30 s a round: round 2 ends ~100, round 3 ~130, + 8 fits
    ([40.0, 70.0, 100.0], True),  # round 3 ends ~130; round 4 would end ~160
])
def test_a_run_stops_after_its_round_when_the_next_would_not_fit(check, ends, stop):
    assert check.stop_after_this_round(ends, budget=150.0, finish=8.0) is stop


def test_the_round_watch_times_each_round_when_its_line_appears(check, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    watch = check.RoundWatch(metrics, budget=100.0, finish=5.0)
    assert watch(3.0) is False and watch.ends == []  # no file yet
    metrics.write_text('{"round": 0}\n')
    assert watch(20.0) is False and watch.ends == [20.0]  # round 1 ~40, round 2 ~60, + 5
    metrics.write_text('{"round": 0}\n{"round": 1}\n{"rou')  # a line being written does not count yet
    assert watch(50.0) is True and watch.ends == [20.0, 50.0]  # 30 s a round: round 3 would end ~110
    assert check.read_jsonl(metrics) == [{"round": 0}, {"round": 1}]


def test_orchestra_gets_most_of_the_presets_time_and_later_methods_what_is_left(check):
    assert check.method_budget(0, 2, 300.0, evaluate_s=20.0, grace_s=30.0) == pytest.approx(0.55 * (300 - 60 - 30))
    assert check.method_budget(0, 1, 300.0, evaluate_s=20.0, grace_s=30.0) == pytest.approx(300 - 40 - 30)
    assert check.method_budget(1, 4, 150.0, evaluate_s=20.0, grace_s=30.0) == pytest.approx(100.0)


def test_a_round_is_split_by_the_timers_and_its_rest_is_what_they_leave(check, tmp_path):
    from privfed.config import build_config
    from privfed.data.federated import FederatedSplit

    run = tmp_path / "run"
    run.mkdir()
    config = build_config("quick", num_clients=4, local_epochs=2, batch_size=16)
    (run / "config.json").write_text(json.dumps(config.to_dict()))
    lines = [{"round": 0, "elapsed_seconds": 5.0, "clients_completed": 4, "sampled_clients": [0, 1, 2, 3]},
             {"round": 1, "elapsed_seconds": 25.0, "clients_completed": 2, "sampled_clients": [1, 3], "knn_accuracy": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    split = tmp_path / "split.jsonl"
    split.write_text(json.dumps({"event": "timers", "missing": []}) + "\n" + json.dumps(
        {"event": "round", "round": 1, "wall_s": 21.0, "seconds": {"train": 6.0, "secagg": 9.0, "knn": 1.0, "client": 2.0},
         "calls": {"train_cohort": 1}}) + "\n")
    figures = check.round_split(run, split)
    zero, one = figures["rounds"]
    assert zero == {"round": 0, "wall_s": 5.0, "clients": 4, "knn": None}  # no timed line: elapsed_seconds' growth
    sizes = FederatedSplit.of(config).client_sizes()
    assert one["samples"] == 2 * (check.samples_per_epoch(sizes[1], 16) + check.samples_per_epoch(sizes[3], 16))
    # The timers' span (21 s), not elapsed_seconds' (20 s): the driver's work after it read its clock is timed too.
    assert (one["wall_s"], one["train_s"], one["secagg_s"], one["knn_s"], one["rest_s"]) == (21.0, 6.0, 9.0, 1.0, 5.0)
    assert one["rest_timed"] == {"client_s": 2.0, "server_s": 0.0}  # part of the rest, not taken from it
    assert one["train_calls"] == {"train_cohort": 1} and figures["timers_missing"] == []


def tiny_arrays(path: Path) -> Path:
    """96 training and 32 test images (random, 10 classes): the probes train on the one and score on the other."""
    rng = np.random.default_rng(0)
    images = lambda n: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    np.savez(path, x=images(96), y=rng.integers(0, 10, 96), x_test=images(32), y_test=rng.integers(0, 10, 32))
    return path


@pytest.mark.slow
def test_the_whole_check_runs_at_a_toy_size_on_the_cpu(tmp_path):
    """About 3.5 minutes on 2 busy cores."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_TOY": "1", "GPU_CHECK_NO_INSTALL": "1",
           "GPU_CHECK_RUN_DIR": str(tmp_path), "PYTHON": sys.executable,
           "GPU_CHECK_DATASET": f"arrays:{tiny_arrays(tmp_path / 'tiny.npz')}",
           "GPU_CHECK_RUNTIME_ARGS": os.environ.get("GPU_CHECK_RUNTIME_ARGS", "--runtime local")}
    subprocess.run(["bash", str(REPO / "benchmarks/gpu/check.sh")], env=env, check=True, timeout=900)
    result = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    parts = result["parts"]
    assert list(parts) == ["env", "step", "cohort", "train", "presets"]
    assert all("error" not in part and part.get("returncode") == 0 for part in parts.values()), parts
    assert {r["step"] for r in parts["step"]["cases"]} == {"privfed", "reference", "reference_model"}
    assert [(r["path"], r["clients"]) for r in parts["cohort"]["cases"]] == [("per_client", 1), ("batched", 2)]
    assert parts["cohort"]["aten_ops"]["batched_clients"] == 2
    train = parts["train"]
    assert [r["round"] for r in train["rounds"]] == [0, 1] and train["timers_missing"] == []
    one = train["rounds"][1]
    assert one["train_s"] > 0 and one["secagg_s"] > 0 and one["knn_s"] > 0  # the paper preset: SecAgg+ on, kNN at the end
    assert one["rest_s"] == pytest.approx(one["wall_s"] - one["train_s"] - one["secagg_s"] - one["knn_s"])
    assert one["rest_s"] >= sum(one["rest_timed"].values())  # the fits' and the aggregation's own time lie inside the rest
    assert train["projected"]["training_from"] == "cohort part" and train["projected"]["run_hours"] > 0
    presets = parts["presets"]
    assert presets["rounds"] == 2 and list(presets["runs"]) == ["orchestra", "rotpred"]
    assert all(run["rounds_done"] == 2 and run["returncode"] == 0 for run in presets["runs"].values())
    assert [r["round"] for r in presets["runs"]["orchestra"]["curve"]] == [0, 1, 2]
    assert presets["runs"]["orchestra"]["curve"][1]["target_entropy"] is not None  # the preset reports client metrics
    probe = {row["encoder"]: row for row in presets["linear_probe"]}
    assert list(probe) == ["untrained", "orchestra", "rotpred"]
    assert all(0 <= row["linear_probe"] <= 1 for row in probe.values()) and probe["untrained"]["rounds"] == 0
    assert result["answers"]["linear_probe"] == [{k: r[k] for k in ("encoder", "rounds", "linear_probe")} for r in probe.values()]
    assert result["answers"]["projected_paper_run_hours"] == train["projected"]["run_hours"]
    assert len(list((tmp_path / "out").iterdir())) <= 8  # what the device tool brings back


def test_the_gpu_sampler_summarises_what_nvidia_smi_printed(check, tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "nvidia-smi"  # prints like --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nwhile true; do echo "40, 1000"; echo "60, 3000"; echo "[N/A], 5"; sleep 0.05; done\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    sampler = check.GpuSampler(tmp_path / "gpu.csv")
    while (tmp_path / "gpu.csv").stat().st_size < 30:
        pass
    summary = sampler.stop()
    assert summary["util_mean_pct"] == pytest.approx(50, abs=10) and summary["util_max_pct"] == 60
    assert summary["memory_used_max_mib"] == 3000


def test_without_nvidia_smi_the_sampler_has_no_figures(check, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert check.GpuSampler(tmp_path / "gpu.csv").stop() is None
