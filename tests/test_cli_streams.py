"""A closed stdout or stderr stops the printing, never the command: real processes, real pipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: A run of two rounds in about twenty seconds, that records its releases (so `attack` has something to invert).
TINY_RUN = ("--dataset", "shapes:300", "--num-clients", "4", "--participation", "1.0", "--backbone", "resnet8",
            "--projection-dim", "16", "--batch-size", "16", "--memory-size", "32", "--num-local-centroids", "4",
            "--num-global-centroids", "8", "--rounds", "2", "--device", "cpu", "--record-releases")


def privfed(*args: str, **popen: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "privfed.cli", *args], **popen)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def head_1_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """``privfed train ... 2>&1 | head -1``: the reader takes one line and closes the pipe; the run's folder and exit."""
    run = tmp_path_factory.mktemp("streams") / "run"
    process = privfed("train", *TINY_RUN, "--out", str(run), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    first = process.stdout.readline()
    process.stdout.close()
    assert first.startswith(b"privfed: "), first
    return run, process.wait(timeout=600)


@pytest.mark.slow
def test_a_run_whose_reader_closed_the_pipe_trains_to_the_end(head_1_run):
    run, code = head_1_run
    assert code == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_early"] is None and summary["rounds"] == 2, summary
    assert (run / "checkpoints" / "final.pt").is_file()


def closed_pipe() -> int:
    """A pipe's write end whose reader is gone: the first write fails (EPIPE)."""
    read, write = os.pipe()
    os.close(read)
    return write


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    ("plot", "{run}", "--out", "{tmp}/p.png"),
    ("evaluate", "{run}", "--train-data", "shapes:300", "--test-data", "shapes:300", "--device", "cpu"),
    ("attack", "{run}", "--method", "decoder", "--steps", "2", "--max-vectors", "2", "--device", "cpu"),
    ("train", "--lr", "nan"),  # the error line itself goes to a closed stderr
])
def test_other_commands_end_as_they_would_with_nobody_reading(command, head_1_run, tmp_path):
    run, _ = head_1_run
    write = closed_pipe()
    argv = [a.replace("{run}", str(run)).replace("{tmp}", str(tmp_path)) for a in command]
    process = privfed(*argv, stdout=write, stderr=write, cwd=tmp_path)
    os.close(write)
    assert process.wait(timeout=600) == (2 if command[0] == "train" else 0)
    if command[0] == "plot":
        assert (tmp_path / "p.png").is_file()
    if command[0] == "attack":
        assert (run / "attack.json").is_file()


@pytest.mark.slow
def test_a_study_runs_its_cell_with_nobody_reading(tmp_path):
    study = tmp_path / "study.toml"
    study.write_text('seeds = [0]\n[base]\ndataset = "shapes:300"\nnum_clients = 4\nparticipation = 1.0\n'
                     'backbone = "resnet8"\nprojection_dim = 16\nbatch_size = 16\nmemory_size = 32\n'
                     'num_local_centroids = 4\nnum_global_centroids = 8\nrounds = 1\ndevice = "cpu"\n')
    write = closed_pipe()
    process = privfed("study", str(study), "--out", str(tmp_path / "out"), stdout=write, stderr=write, cwd=tmp_path)
    os.close(write)
    assert process.wait(timeout=600) == 0
    assert (tmp_path / "out" / "results.csv").is_file()
