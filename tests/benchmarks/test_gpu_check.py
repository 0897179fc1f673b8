"""``benchmarks/gpu/check.py``: its sizes, its projection to the paper's run, and the whole check at a toy size on the CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu" / "check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_gpu_sizes_fit_the_check_and_any_one_can_be_overridden(check):
    gpu = check.settings({})  # 16 clients per round: 50 did not finish round 1 in the budget on an H100
    assert (gpu.device, gpu.clients, gpu.rounds, gpu.batches, gpu.runtime_args) == ("cuda", 32, 2, "16 64 256", "--runtime local")
    assert gpu.train_args == "--participation 0.5"
    assert gpu.dataset.endswith(".gpu-wheelhouse/data/cifar10-dev.npz")
    assert sum(gpu.budgets.values()) + 60 <= 480 - 15  # the train part's grace and the install fit the 8 minutes
    toy = check.settings({"GPU_CHECK_TOY": "1", "GPU_CHECK_ROUNDS": "2", "GPU_CHECK_BUDGET_TRAIN": "5", "GPU_CHECK_RUNTIME_ARGS": ""})
    assert (toy.device, toy.clients, toy.rounds, toy.budgets["train"], toy.runtime_args) == ("cpu", 3, 2, 5.0, "")


def test_an_epoch_drops_a_trailing_batch_of_one(check):
    assert [check.client_steps(n, 16) for n in (0, 1, 2, 16, 17, 18, 500)] == [0, 0, 1, 1, 1, 2, 32]


def test_the_paper_projection_scales_steps_and_evaluations_and_keeps_the_rest_of_a_round(check):
    rounds = [
        {"round": 0, "wall_s": 10.0, "knn": None},
        {"round": 1, "step_ms": 10.0, "rest_s": 20.0, "knn": None},
        {"round": 2, "step_ms": 10.0, "rest_s": 20.0, "knn": None},
        {"round": 3, "step_ms": 10.0, "rest_s": 30.0, "knn": 0.3},
    ]
    projected = check.paper_projection(rounds, batch_size=16, images_here=6000)
    assert projected["steps_per_round"] == 50 * 10 * 32
    assert projected["local_train_s_per_round"] == pytest.approx(160.0)
    assert projected["rest_s_per_round"] == 20.0
    assert projected["knn_eval_s"] == pytest.approx(10.0 * 60_000 / 6000)
    assert projected["run_hours"] * 3600 == pytest.approx(10 + 100 * (160 + 20) + 10 * 100)


def tiny_arrays(path: Path) -> Path:
    """96 training and 32 test images (random, 10 classes): the attack's auxiliary set is the test split."""
    rng = np.random.default_rng(0)
    images = lambda n: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    np.savez(path, x=images(96), y=rng.integers(0, 10, 96), x_test=images(32), y_test=rng.integers(0, 10, 32))
    return path


@pytest.mark.slow
def test_the_whole_check_runs_at_a_toy_size_on_the_cpu(tmp_path):
    """About 3 minutes on 2 busy cores, most of it starting Ray."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_TOY": "1", "GPU_CHECK_NO_INSTALL": "1",
           "GPU_CHECK_RUN_DIR": str(tmp_path), "PYTHON": sys.executable,
           "GPU_CHECK_DATASET": f"arrays:{tiny_arrays(tmp_path / 'tiny.npz')}",
           "GPU_CHECK_RUNTIME_ARGS": os.environ.get("GPU_CHECK_RUNTIME_ARGS", "")}
    subprocess.run(["bash", str(REPO / "benchmarks/gpu/check.sh")], env=env, check=True, timeout=600)
    result = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    parts = result["parts"]
    assert all("error" not in part and part.get("returncode") == 0 for part in parts.values()), parts
    assert {r["step"] for r in parts["step"]["cases"]} == {"privfed", "reference", "reference_model"}
    assert [r["round"] for r in parts["train"]["rounds"]] == [0, 1]
    assert parts["train"]["projected"]["run_hours"] > 0
    assert parts["attack"]["result"]["rounds"][0]["vectors"] == 4
    assert 0 <= parts["evaluate"]["result"]["accuracy"] <= 1
    assert result["answers"]["projected_paper_run_hours"] == parts["train"]["projected"]["run_hours"]
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
