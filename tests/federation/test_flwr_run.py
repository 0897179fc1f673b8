"""`flwr run .` runs the same ServerApp and ClientApp as `privfed train` (slow: starts a SuperLink)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_flwr_run_trains_and_writes_a_run_directory(tmp_path):
    out = tmp_path / "run"
    env = {
        **os.environ,
        "FLWR_HOME": str(tmp_path / "flwr-home"),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "39191",
        "FLWR_LOCAL_CONTROL_API_PORT": "39193",
    }
    try:
        result = subprocess.run(
            [
                "flwr", "run", ".",
                "--run-config", f"rounds=1 dataset='shapes:400' num-clients=4 out='{out}'",
                "--federation-config", "num-supernodes=4",
                "--stream",
            ],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        )
    finally:
        subprocess.run(["pkill", "-f", f"flower-superlink.*{tmp_path}"], check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 1
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
