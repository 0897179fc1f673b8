"""Budgets under a real Flower run: refusal before start, clean stop with everything saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QUICK = str(REPO / "configs" / "quick.toml")


def test_run_certain_to_exceed_its_budget_refuses_to_start(tmp_path, run_privfed):
    out = tmp_path / "refused"
    result = run_privfed(
        "train", "--config", QUICK, "--mechanism", "ldp", "--epsilon", "1", "--epsilon-per-release", "0.6",
        "--out", str(out),
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "training rounds fit" in result.stderr
    assert not out.exists()  # nothing started


def test_budget_running_out_stops_training_cleanly(tmp_path, run_privfed):
    out = tmp_path / "stopped"
    result = run_privfed(
        "train", "--config", QUICK, "--mechanism", "ldp", "--epsilon", "1", "--epsilon-per-release", "0.45",
        "--participation", "0.5", "--num-global-centroids", "8", "--num-local-centroids", "4", "--rounds", "6",
        "--out", str(out), "--device", "cpu",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"] and "privacy budget" in summary["stopped_early"]
    assert summary["rounds"] < 6
    assert summary["privacy"]["epsilon"] <= 1.0
    assert summary["privacy"]["budget"] == 1.0
    assert summary["privacy"]["epsilon_per_release"] == pytest.approx(0.45, rel=0.01)  # as calibrated
    assert (out / "checkpoints" / "final.pt").is_file()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == list(range(summary["rounds"] + 1))
    assert all(r["privacy_epsilon"] <= 1.0 for r in records)
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == sum(r["clients_completed"] for r in records)
