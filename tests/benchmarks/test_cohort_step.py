"""``benchmarks/gpu/cohort_step.py`` at a toy size on the CPU: both paths timed, compared, and their ops counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.benchmarks.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "cohort_step.py"


@pytest.fixture(scope="module")
def cohort_step():
    return load_script("cohort_step", SCRIPT)


def test_a_toy_run_times_one_client_alone_and_two_together_and_counts_their_ops(cohort_step, tmp_path):
    out = tmp_path / "cohort.json"
    result = cohort_step.run(device=torch.device("cpu"), clients=[2], per_client_clients=1, images=9, batch=4, epochs=1,
                             repeats=1, backbone="resnet8", ops_clients=2, out=out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert (result["steps_per_client"], result["samples_per_client"]) == (2, 8)  # 9 images at batch 4: a batch of one is dropped
    alone, together = result["cases"]
    assert (alone["path"], alone["clients"], together["path"], together["clients"]) == ("per_client", 1, "batched", 2)
    for row in (alone, together):
        assert "error" not in row, row
        assert row["samples_per_s"] == pytest.approx(row["clients"] * 8 / row["seconds_per_call"])
        assert row["gpu_util_mean"] is None and row["memory_max_gib"] is None  # no GPU here
    assert together["max_abs_diff_first_client"] < 1e-4  # the same client, seeded alike: fp32 rounding apart
    assert result["speedups"] == {"batched_2_over_per_client": together["samples_per_s"] / alone["samples_per_s"]}
    ops = result["aten_ops"]
    assert ops["batched_clients"] == 2 and ops["per_client_outer_per_step"] > 100
    assert ops["batched_outer_per_client_step"] == pytest.approx(ops["batched_outer_per_step"] / 2)
    # One call for both clients: fewer ops per client-step than a client alone takes.
    assert ops["batched_outer_per_client_step"] < ops["per_client_outer_per_step"]


def test_a_method_without_a_batched_step_is_refused(cohort_step):
    with pytest.raises(ValueError, match="batched step"):
        cohort_step.bench(backbone="resnet8", method="supervised", batch=2, epochs=1, images=4, clients=1, device=torch.device("cpu"))
