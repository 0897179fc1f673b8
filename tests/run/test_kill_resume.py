"""`kill -9` at any point of a round, then `--resume`, ends exactly where the run left alone ends (issue 28, item 4).

One real `privfed train` (SecAgg+, kanon) is killed with SIGKILL four times, once per round, at a different point
of the round each time, and resumed after each kill; its metrics (timings aside), final checkpoint, server ledger
and client ledgers must equal those of the same run never interrupted. The points are read from the clients' own
files: a client charges a round in its ledger before it computes and stores its reply before it sends it.
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
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.run_records import jsonl, same

ROUNDS = 4
CLIENTS_PER_ROUND = 3
TRAIN = [
    "--dataset", "shapes:300", "--num-clients", "4", "--participation", "0.75", "--rounds", str(ROUNDS),
    "--local-epochs", "1", "--memory-size", "32", "--num-local-centroids", "4", "--num-global-centroids", "8",
    "--projection-dim", "16", "--device", "cpu", "--seed", "5", "--runtime", "ray",
]


def charged(run: Path, round_index: int) -> int:
    """How many clients' own ledgers have charged ``round_index``."""
    count = 0
    for path in (run / "client-ledgers").glob("*.jsonl"):
        try:
            count += any(json.loads(line)["round"] == round_index for line in path.read_text().splitlines() if line)
        except (OSError, ValueError):
            pass  # being written
    return count


def answered(run: Path, round_index: int) -> int:
    """How many clients have stored their reply to ``round_index`` (a reply is stored before it is sent)."""
    count = 0
    for path in (run / "client-ledgers").glob("privfed-reply-partition-*.npz"):
        try:
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(data["header"].tobytes().decode())
        except (OSError, ValueError, KeyError):
            continue  # being replaced
        count += header["round"] == round_index and "tensors" in header
    return count


def logged(run: Path, round_index: int) -> bool:
    path = run / "metrics.jsonl"
    return path.is_file() and any(json.loads(line)["round"] == round_index for line in path.read_text().splitlines())


#: Where in round r each kill lands: (name, condition on the run directory, extra wait before the kill).
POINTS: list[tuple[str, Callable[[Path, int], bool], float]] = [
    ("before any client answered", lambda run, r: charged(run, r) >= 1 and answered(run, r) == 0, 0.0),
    ("after some clients answered", lambda run, r: 1 <= answered(run, r) < CLIENTS_PER_ROUND, 0.0),
    ("after every client answered", lambda run, r: answered(run, r) == CLIENTS_PER_ROUND, 0.0),
    ("during aggregation", lambda run, r: answered(run, r) == CLIENTS_PER_ROUND, 0.3),
]


def train(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "privfed.cli", "train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=env,
    )


def kill_at(process: subprocess.Popen, run: Path, round_index: int, point: str, condition, wait: float) -> None:
    """SIGKILLs ``process`` as soon as ``condition`` holds in round ``round_index`` (after ``wait`` seconds more)."""
    deadline = time.monotonic() + 400
    while not condition(run, round_index):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"{point}, round {round_index}: never reached ({process.stderr.read()[-2000:]})")
        time.sleep(0.01)
    time.sleep(wait)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not logged(run, round_index), f"{point}: the kill came after round {round_index} was logged"


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.endswith("seconds")}


@pytest.mark.slow
def test_sigkill_at_each_point_of_a_round_then_resume_gives_the_uninterrupted_run():
    temp = Path(tempfile.mkdtemp(prefix="k", dir="/tmp"))  # short: Ray's sockets go below TMPDIR
    # Ray's memory monitor kills a worker when the machine is short of memory (other jobs); that failure would be
    # the machine's, not the resume's, so it is off here.
    env = {**os.environ, "TMPDIR": str(temp), "RAY_memory_monitor_refresh_ms": "0"}
    try:
        whole, killed = temp / "whole", temp / "killed"
        alone = train([*TRAIN, "--out", str(whole)], env)
        process = train([*TRAIN, "--out", str(killed)], env)
        for round_index, (point, condition, wait) in enumerate(POINTS, start=1):
            kill_at(process, killed, round_index, point, condition, wait)
            process = train(["--resume", str(killed)], env)
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-3000:]
        _, stderr = alone.communicate(timeout=600)
        assert alone.returncode == 0, stderr[-3000:]

        a, b = jsonl(whole / "metrics.jsonl"), jsonl(killed / "metrics.jsonl")
        assert [m["round"] for m in b] == list(range(ROUNDS + 1))
        for x, y in zip(a, b):
            assert same(comparable(x), comparable(y)), (comparable(x), comparable(y))
        assert all(m["clients_completed"] == CLIENTS_PER_ROUND for m in b[1:])  # nobody refused a replayed round
        final_a = torch.load(whole / "checkpoints" / "final.pt", weights_only=True)
        final_b = torch.load(killed / "checkpoints" / "final.pt", weights_only=True)
        for key, value in final_a["network"].items():
            assert torch.equal(value, final_b["network"][key]), key
        assert torch.equal(final_a["centroids"], final_b["centroids"])
        assert jsonl(whole / "ledger.jsonl") == jsonl(killed / "ledger.jsonl")
        ledgers = sorted(path.name for path in (whole / "client-ledgers").glob("*.jsonl"))
        assert ledgers == sorted(path.name for path in (killed / "client-ledgers").glob("*.jsonl"))
        for name in ledgers:
            assert jsonl(whole / "client-ledgers" / name) == jsonl(killed / "client-ledgers" / name), name
        assert not list((killed / "client-ledgers").glob("*.npz"))  # a finished run keeps no reply
        assert not list(temp.glob("privfed-ray-*"))  # each start removed the Ray folder the previous kill left
    finally:
        shutil.rmtree(temp, ignore_errors=True)
