"""A study cell killed mid-round is never kept when its resumed run cannot equal the run left alone (issue 28, item 4).

The cell's run is a real simulation in a subprocess, killed with SIGKILL once some clients answered round 1. Its
clients' stored replies are then removed, as a run begun before privfed kept them leaves it: those clients refuse
the replayed round, the resumed run would differ, and the study trains the cell again from nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from privfed.config import build_config
from privfed.run.driver import IN_PROGRESS_STATEMENT
from privfed.studies.cell_work import train_cell
from privfed.studies.grid import Cell
from tests.run.test_kill_resume import answered, logged
from tests.run_records import jsonl

OPTIONS = dict(
    dataset="shapes:300", num_clients=4, participation=0.75, rounds=2, local_epochs=1, memory_size=32,
    num_local_centroids=4, num_global_centroids=8, projection_dim=16, device="cpu", seed=5,
)
SCRIPT = """
import json, sys
from privfed.config import build_config
from privfed.federation.simulation import simulate
from privfed.run.plan import plan_run
simulate(plan_run(build_config(**json.loads(sys.argv[1]))))
"""


@pytest.mark.slow
def test_a_killed_cell_whose_round_cannot_be_replayed_is_trained_again(monkeypatch):
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "0")  # no worker killed for other jobs' memory use
    temp = Path(tempfile.mkdtemp(prefix="c", dir="/tmp"))  # short: Ray's sockets go below TMPDIR
    try:
        run = temp / "run"
        process = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, json.dumps({**OPTIONS, "out": str(run)})],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "TMPDIR": str(temp), "RAY_memory_monitor_refresh_ms": "0"},
        )
        deadline = time.monotonic() + 300
        while not answered(run, 1):
            assert process.poll() is None and time.monotonic() < deadline, "round 1 was never answered"
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        assert not logged(run, 1) and (run / "checkpoints" / "resume.pt").is_file()
        for reply in (run / "client-ledgers").glob("privfed-reply-partition-*.npz"):
            reply.unlink()

        config = build_config(**OPTIONS, out=str(run))
        summary = train_cell(Cell("cell", {}, OPTIONS["seed"], config), run, record_releases=False)
        assert summary["rounds"] == 2 and summary["stopped_early"] is None
        metrics = jsonl(run / "metrics.jsonl")
        assert [m["round"] for m in metrics] == [0, 1, 2]  # one log, from nothing: the resumed one was dropped
        assert all(m["clients_completed"] == m["clients_sampled"] for m in metrics)
        statements = [entry["guarantee"]["statement"] for entry in jsonl(run / "ledger.jsonl")]
        assert IN_PROGRESS_STATEMENT not in statements
    finally:
        shutil.rmtree(temp, ignore_errors=True)
