"""`privfed study` on a tiny grid: every cell trained and scored once, a rerun redoes nothing, Ctrl-C stops and resumes."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow  # four tiny federated runs

STUDY = """
seeds = [0, 1]
[base]
dataset = "shapes:120"
num_clients = 3
participation = 1.0
projection_dim = 16
local_epochs = 1
batch_size = 16
memory_size = 32
num_local_centroids = 4
num_global_centroids = 8
rounds = {rounds}
secagg = false
device = "cpu"
[[grid]]
mechanism = ["reps", "kanon"]
"""


def privfed(*args: str, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "privfed.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_study_runs_every_cell_once_and_a_rerun_redoes_nothing(tmp_path):
    (tmp_path / "tiny.toml").write_text(STUDY.format(rounds=1))
    first = privfed("study", "tiny.toml", "--out", "out", cwd=tmp_path)
    stdout, stderr = first.communicate(timeout=900)
    assert first.returncode == 0, stderr[-3000:]
    assert "[4/4] mechanism-kanon-seed1" in stdout
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    assert [(r["cell"], r["seed"]) for r in rows] == [
        ("mechanism-reps", "0"), ("mechanism-reps", "1"), ("mechanism-kanon", "0"), ("mechanism-kanon", "1")]
    assert all(0 < float(r["knn"]) <= 1 and 0 < float(r["linear"]) <= 1 for r in rows)
    assert "| mechanism-kanon | 2 |" in (tmp_path / "out" / "results.md").read_text()
    again = privfed("study", "tiny.toml", "--out", "out", cwd=tmp_path)
    stdout, _ = again.communicate(timeout=300)
    assert again.returncode == 0 and "[" not in stdout.split("wrote")[0]  # no cell ran


def test_ctrl_c_stops_the_study_and_the_same_command_finishes_it_without_redoing_a_cell(tmp_path):
    (tmp_path / "tiny.toml").write_text(STUDY.format(rounds=3))
    first = privfed("study", "tiny.toml", "--out", "out", cwd=tmp_path)
    second_cell = tmp_path / "out" / "cells" / "mechanism-reps-seed1" / "run" / "metrics.jsonl"
    deadline = time.time() + 600
    while not (second_cell.is_file() and len(second_cell.read_text().splitlines()) >= 2) and time.time() < deadline:
        time.sleep(0.5)
    os.kill(first.pid, signal.SIGINT)  # during the second cell's run
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == 130, stderr[-3000:]
    finished = (tmp_path / "out" / "cells" / "mechanism-reps-seed0" / "cell.json").stat().st_mtime
    assert not (tmp_path / "out" / "cells" / "mechanism-reps-seed1" / "cell.json").exists()
    again = privfed("study", "tiny.toml", "--out", "out", cwd=tmp_path)
    stdout, stderr = again.communicate(timeout=900)
    assert again.returncode == 0, stderr[-3000:]
    assert "mechanism-reps-seed0" not in stdout.split("wrote")[0]  # the finished cell was not redone
    assert (tmp_path / "out" / "cells" / "mechanism-reps-seed0" / "cell.json").stat().st_mtime == finished
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    assert len(rows) == 4 and all(r["rounds"] == "3" and not r.get("error") for r in rows)
