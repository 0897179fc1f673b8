"""Twenty sampled clients under SecAgg+, 30 % failing at random stages: the audit in benchmarks/secagg_dropouts.py holds.

The benchmark predicts every round from its seeded dropout plan and checks
the run's log, the server's and the clients' ledgers and the summary against
it. The threshold (15 of 20) is set so that, for this seed, some rounds have
enough survivors to unmask and some do not: both outcomes are exercised.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.dropout_injection import DropoutPlan, expected_round

pytestmark = pytest.mark.slow  # a 20-client SecAgg+ simulation of four rounds

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "secagg_dropouts.py"
THRESHOLD, ROUNDS, SEED = 15, 4, 0


def test_rounds_complete_when_the_threshold_allows_and_nothing_is_lost_or_charged_twice(tmp_path):
    outcomes = {expected_round(DropoutPlan(0.3, seed=SEED), r + 1, list(range(20)), THRESHOLD).completes
                for r in range(1, ROUNDS + 1)}
    assert outcomes == {True, False}, "the seed must give both completed and halted rounds"
    report = tmp_path / "audit.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), "--clients", "20", "--sampled", "20", "--rounds", str(ROUNDS),
         "--rate", "0.3", "--threshold", str(THRESHOLD), "--seed", str(SEED), "--out", str(tmp_path / "run"),
         "--json", str(report)],
        capture_output=True, text=True, timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    audit = json.loads(report.read_text())
    assert audit["problems"] == []
    assert [r["round"] for r in audit["rounds"]] == list(range(1, ROUNDS + 1))
    assert {r["completed"] for r in audit["rounds"]} == {True, False}
    assert all(sum(r["failed_at"].values()) > 0 for r in audit["rounds"])
