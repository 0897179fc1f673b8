"""Ctrl-C: the first stops a real `privfed train` cleanly after the current round, the second stops at once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_the_first_ctrl_c_stops_after_the_current_round_with_a_summary_and_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "privfed.cli", "train", *TRAIN, "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        read_until(process, "round   1")
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 130, stderr[-2000:]
    assert "stopping after the current round" in stderr and "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"].startswith("interrupted by SIGINT; stopped after round")
    rounds = [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert 1 <= summary["rounds"] == rounds[-1] < 40 and rounds == list(range(len(rounds)))
    assert (out / "checkpoints" / "final.pt").exists()
    charged = {(entry["client"], entry["round"]) for entry in map(json.loads, (out / "ledger.jsonl").read_text().splitlines())}
    assert max(r for _, r in charged) == summary["rounds"]  # nothing charged for a round that did not finish


SCRIPT = """
import sys, time
from privfed.interruption import stop_on_signals
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
