"""Ctrl-C: the first stops a real `privfed train` cleanly after the current round, the second stops at once.

SIGTERM is a Ctrl-C too, under Ray as well: Ray's driver installs a handler that aborts the process.
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

from privfed.federation.simulation import descendants

TRAIN = [
    "--dataset", "shapes:300", "--num-clients", "3", "--rounds", "40", "--local-epochs", "1", "--memory-size", "32",
    "--num-local-centroids", "4", "--num-global-centroids", "8", "--projection-dim", "16", "--device", "cpu",
]


def read_until(process: subprocess.Popen, marker: str, timeout: float = 300) -> list[str]:
    """Lines of the process's stdout up to and including the first that contains ``marker``."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError(f"no {marker!r} in the output: {''.join(lines)}")


def stopped_after_round_1(out: Path, stop: signal.Signals, options: list[str]) -> tuple[subprocess.Popen, str]:
    """A real `privfed train` sent ``stop`` once round 1 is printed, and left to stop; the process and its stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "privfed.cli", "train", *options, "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        read_until(process, "round   1")
        process.send_signal(stop)
        _, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    return process, stderr


def test_the_first_ctrl_c_stops_after_the_current_round_with_a_summary_and_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    process, stderr = stopped_after_round_1(out, signal.SIGINT, TRAIN)
    assert process.returncode == 130, stderr[-2000:]
    assert "stopping after the current round" in stderr and "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"].startswith("interrupted by SIGINT; stopped after round")
    rounds = [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert 1 <= summary["rounds"] == rounds[-1] < 40 and rounds == list(range(len(rounds)))
    assert (out / "checkpoints" / "final.pt").exists()
    charged = {(entry["client"], entry["round"]) for entry in map(json.loads, (out / "ledger.jsonl").read_text().splitlines())}
    assert max(r for _, r in charged) == summary["rounds"]  # nothing charged for a round that did not finish


@pytest.mark.slow
def test_sigterm_under_ray_stops_after_the_round_with_a_summary_and_the_run_resumes(tmp_path):
    """SIGTERM is what a scheduler or `docker stop` sends: it must not lose the run, nor leave Ray's files behind."""
    out = tmp_path / "run"
    short = [*TRAIN, "--runtime", "ray"]
    short[short.index("--rounds") + 1] = "4"
    process, stderr = stopped_after_round_1(out, signal.SIGTERM, short)
    assert process.returncode == 130, stderr[-2000:]
    assert "SIGTERM: stopping after the current round" in stderr and "SIGTERM received" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"].startswith("interrupted by SIGTERM; stopped after round") and summary["rounds"] < 4
    assert (out / "checkpoints" / "final.pt").exists()
    assert not list(Path("/tmp/ray").glob(f"session_*_{process.pid}"))  # Ray ran in a directory of its own, now gone

    resumed = subprocess.run(
        [sys.executable, "-m", "privfed.cli", "train", "--resume", str(out)], capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"] is None and summary["rounds"] == 4
    rounds = [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rounds == list(range(5))


def alive(pid: int) -> bool:
    """Running, not a zombie left for a parent (in a container, possibly one that never reaps) to collect."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
def test_the_second_ctrl_c_under_ray_leaves_no_ray_process_or_folder():
    """An immediate stop cannot wait for Ray's shutdown; its processes must not live on without their driver."""
    temp = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))  # short: Ray's sockets go below it
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "privfed.cli", "train", *TRAIN, "--runtime", "ray", "--out", str(temp / "run")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(temp)},
        )
        try:
            read_until(process, "round   1")
            ray = descendants(process.pid)
            process.send_signal(signal.SIGINT)
            time.sleep(0.5)
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
        finally:
            process.kill()
        assert process.returncode == 128 + signal.SIGINT
        assert len(ray) >= 4  # GCS, raylet, agents, workers
        time.sleep(1)
        assert not [pid for pid in ray if alive(pid)]
        assert not list(temp.glob("privfed-ray-*"))  # Ray's folder is gone
    finally:
        shutil.rmtree(temp, ignore_errors=True)


SCRIPT = """
import sys, time
from privfed.run.interruption import stop_on_signals
with stop_on_signals() as stop:
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
        if stop.requested:
            print("requested:", stop.reason, flush=True)
            time.sleep(600)  # a round that takes its time
"""


def signal_twice(sig: signal.Signals) -> tuple[str, subprocess.Popen]:
    """Sends ``sig`` to a process inside ``stop_on_signals`` twice; returns its line after the first, and the process."""
    process = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        read_until(process, "ready", timeout=60)
        process.send_signal(sig)
        after_first = read_until(process, "requested", timeout=60)[-1]
        assert process.poll() is None  # the first signal only asked
        process.send_signal(sig)
        process.wait(timeout=30)
    finally:
        process.kill()
    return after_first, process


def test_the_second_ctrl_c_stops_at_once():
    after_first, process = signal_twice(signal.SIGINT)
    assert "requested: interrupted by SIGINT" in after_first
    assert process.returncode == 128 + signal.SIGINT
    assert "SIGINT again: stopping now" in process.stderr.read()


def test_sigterm_is_a_ctrl_c_too():
    after_first, process = signal_twice(signal.SIGTERM)
    assert "interrupted by SIGTERM" in after_first
    assert process.returncode == 128 + signal.SIGTERM
