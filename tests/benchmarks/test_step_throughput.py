"""``benchmarks/gpu/step_throughput.py`` at a toy size on the CPU: every case is timed and the JSON has its fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.benchmarks.scripts import load_script

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "step_throughput.py"


@pytest.fixture(scope="module")
def step_throughput():
    return load_script("step_throughput", BENCHMARK)


def test_a_toy_run_times_privfed_in_both_layouts_and_both_reference_variants(step_throughput, tmp_path):
    out = tmp_path / "step.json"
    result = step_throughput.run(device=torch.device("cpu"), batches=[4], steps=1, warmup=0, backbone="resnet8", out=out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["device"] == "cpu" and result["gpu"] is None and result["torch"] == torch.__version__
    kinds = [(r["step"], r["dtype"], r["channels_last"]) for r in result["cases"]]
    assert kinds == [
        ("privfed", "fp32", False), ("privfed", "fp32", True), ("reference", "fp32", False), ("reference_model", "fp32", False),
    ]
    for row in result["cases"]:
        assert "error" not in row, row
        assert row["batch"] == 4 and row["samples_per_s"] > 0
        assert row["samples_per_s"] == pytest.approx(4000 / row["ms_per_step"])
        assert row["gpu_util_mean"] is None  # no GPU to sample
    assert set(result["ratios"]) == {
        "b4_fp32_over_reference", "b4_best_over_reference", "b4_fp32_over_reference_model", "b4_best_over_reference_model",
    }


def test_the_reference_views_are_normalised_per_image_and_view_3_is_a_quarter_turn_labelled_0_to_3(step_throughput):
    from PIL import Image

    pictures = [Image.new("RGB", (32, 32), (255, 0, 0)) for _ in range(6)]
    x1, x2, x3, turns = step_throughput.reference_views(pictures)
    assert x1.shape == x2.shape == x3.shape == (6, 3, 32, 32)
    assert turns.dtype == torch.int64 and set(turns.tolist()) <= {0, 1, 2, 3}
    assert x1.min() >= -2.0 and x1.max() <= 2.0  # (x - 0.5) / 0.25 of [0, 1]


def test_bf16_is_measured_only_on_cuda(step_throughput):
    cases = step_throughput.build_cases([16, 64], bf16=False)
    assert {c.dtype for c in cases} == {"fp32"}
    assert len(step_throughput.build_cases([16, 64], bf16=True)) == 2 * (4 + 2)


def test_privfed_s_step_runs_under_bf16_autocast_in_channels_last(step_throughput):
    case = step_throughput.Case("privfed", 4, "bf16", True)  # the GPU's case, under the CPU's autocast
    row = step_throughput.measure_case(case, backbone="resnet8", device=torch.device("cpu"), steps=1, warmup=0)
    assert row["dtype"] == "bf16" and row["channels_last"] and row["samples_per_s"] > 0
