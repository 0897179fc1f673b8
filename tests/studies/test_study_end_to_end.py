"""`privfed study` on a tiny grid: every cell trained and scored once, a rerun redoes nothing.

Ctrl-C or a kill stops it and the same command finishes it.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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
    (tmp_path / "tiny.toml").write_text(STUDY.format(rounds=1).replace("seeds = [0, 1]", "seeds = [0, 1]\nfinetune = [0.5]"))
    first = privfed("study", "tiny.toml", "--out", "out", cwd=tmp_path)
    stdout, stderr = first.communicate(timeout=900)
    assert first.returncode == 0, stderr[-3000:]
    assert "[4/4] mechanism-kanon-seed1" in stdout
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    assert [(r["cell"], r["seed"]) for r in rows] == [
        ("mechanism-reps", "0"), ("mechanism-reps", "1"), ("mechanism-kanon", "0"), ("mechanism-kanon", "1")]
    assert all(0 < float(r[column]) <= 1 for r in rows
               for column in ("knn", "linear", "knn_init", "linear_init", "finetune_0.5", "finetune_0.5_init"))
    # Every cell's untrained network is its seed's: the same for both mechanisms.
    for column in ("linear_init", "finetune_0.5_init"):
        assert rows[0][column] == rows[2][column] and rows[1][column] == rows[3][column]
    assert "accuracy-by-setting.png" in stdout
    results = (tmp_path / "out" / "results.md").read_text()
    assert "| mechanism-kanon | 2 |" in results
    # Both reps runs share one statement: listed once, for the setting, not once per run.
    assert results.count("> No guarantee: clients release their representations in the clear (reps)") == 1
    assert "Applies to **mechanism-reps**." in results and results.count("docs/privacy.md#statement-") <= 3
    again = privfed("study", "tiny.toml", "--out", "out", cwd=tmp_path)
    stdout, _ = again.communicate(timeout=300)
    assert again.returncode == 0 and "[" not in stdout.split("wrote")[0]  # no cell ran


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from /proc: Ray's workers and helpers)."""
    children: dict[int, list[int]] = {}
    for stat in os.listdir("/proc"):
        if stat.isdigit():
            try:
                fields = Path(f"/proc/{stat}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(stat))
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found


def wait_for_the_second_cell(tmp_path, rounds_logged: int) -> None:
    second_cell = tmp_path / "out" / "cells" / "mechanism-reps-seed1" / "run" / "metrics.jsonl"
    deadline = time.time() + 600
    while not (second_cell.is_file() and len(second_cell.read_text().splitlines()) >= rounds_logged):
        assert time.time() < deadline, "the study never reached its second cell"
        time.sleep(0.5)


def test_a_killed_study_finishes_without_redoing_a_finished_cell(tmp_path):
    (tmp_path / "tiny.toml").write_text(STUDY.format(rounds=3))
    first = privfed("study", "tiny.toml", "--out", "out", cwd=tmp_path)
    wait_for_the_second_cell(tmp_path, rounds_logged=2)
    helpers = descendants(first.pid)
    first.kill()  # SIGKILL mid-cell: no handler runs, the cell in progress has no cell.json
    first.communicate(timeout=60)
    for pid in helpers:  # Ray's processes die with their driver; make sure none outlives the test
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    finished = tmp_path / "out" / "cells" / "mechanism-reps-seed0"
    finished_at = (finished / "cell.json").stat().st_mtime
    metrics = (finished / "run" / "metrics.jsonl").read_text()
    assert not (tmp_path / "out" / "cells" / "mechanism-reps-seed1" / "cell.json").exists()
    again = privfed("study", "tiny.toml", "--out", "out", cwd=tmp_path)
    stdout, stderr = again.communicate(timeout=900)
    assert again.returncode == 0, stderr[-3000:]
    assert "mechanism-reps-seed0" not in stdout.split("wrote")[0]  # the finished cell was not redone
    assert (finished / "cell.json").stat().st_mtime == finished_at and (finished / "run" / "metrics.jsonl").read_text() == metrics
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    assert len(rows) == 4 and all(r["rounds"] == "3" and not r.get("error") for r in rows)


def test_ctrl_c_stops_the_study_and_the_same_command_finishes_it_without_redoing_a_cell(tmp_path):
    (tmp_path / "tiny.toml").write_text(STUDY.format(rounds=3))
    first = privfed("study", "tiny.toml", "--out", "out", cwd=tmp_path)
    wait_for_the_second_cell(tmp_path, rounds_logged=2)
    os.kill(first.pid, signal.SIGINT)  # during the second cell's run
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == 130, stderr[-3000:]
    finished = (tmp_path / "out" / "cells" / "mechanism-reps-seed0" / "cell.json").stat().st_mtime
    assert not (tmp_path / "out" / "cells" / "mechanism-reps-seed1" / "cell.json").exists()
    assert "Partial: 1 of the study's 4 runs" in (tmp_path / "out" / "results.md").read_text()  # the results so far
    again = privfed("study", "tiny.toml", "--out", "out", cwd=tmp_path)
    stdout, stderr = again.communicate(timeout=900)
    assert again.returncode == 0, stderr[-3000:]
    assert "mechanism-reps-seed0" not in stdout.split("wrote")[0]  # the finished cell was not redone
    assert (tmp_path / "out" / "cells" / "mechanism-reps-seed0" / "cell.json").stat().st_mtime == finished
    assert "Partial" not in (tmp_path / "out" / "results.md").read_text()
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    assert len(rows) == 4 and all(r["rounds"] == "3" and not r.get("error") for r in rows)


def test_tune_ranks_the_grid_by_the_label_free_score_and_shows_the_accuracy(tmp_path):
    study = STUDY.format(rounds=1).replace("seeds = [0, 1]", "seeds = [0]").replace(
        'mechanism = ["reps", "kanon"]', "lr = [0.1, 0.03, 0.003]")
    (tmp_path / "tune.toml").write_text(study)
    tune = privfed("tune", "tune.toml", "--out", "out", cwd=tmp_path)
    stdout, stderr = tune.communicate(timeout=900)
    assert tune.returncode == 0, stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    scores = {r["cell"]: float(r["alignment"]) + 0.2 * float(r["uniformity"]) for r in rows}
    assert all(abs(scores[r["cell"]] - float(r["tuning_score"])) < 1e-9 for r in rows)
    ranked = [line.split(" | ")[1] for line in (tmp_path / "out" / "tuning.md").read_text().splitlines()
              if line.startswith("| ") and line[2].isdigit()]
    assert ranked == sorted(scores, key=scores.get, reverse=True)
    assert "Spearman rank correlation of score and linear accuracy over 3 settings" in stdout


def test_an_attacked_study_scores_every_mechanism_and_draws_every_picture(tmp_path):
    """reps (one source per vector), kanon (replayable members) and ldp (members unknown) each get their row."""
    study = STUDY.format(rounds=1).replace("seeds = [0, 1]", 'seeds = [0]\nattack = "decoder"\n[attack_settings]\nsteps = 5')
    study = study.replace('mechanism = ["reps", "kanon"]', 'mechanism = ["reps", "kanon"]\n[[grid]]\nmechanism = ["ldp"]\nepsilon = [50.0]')
    (tmp_path / "attacked.toml").write_text(study)
    run = privfed("study", "attacked.toml", "--out", "out", cwd=tmp_path)
    _, stderr = run.communicate(timeout=900)
    assert run.returncode == 0, stderr[-3000:]
    rows = {r["cell"]: r for r in csv.DictReader((tmp_path / "out" / "results.csv").open())}
    assert set(rows) == {"mechanism-reps", "mechanism-kanon", "mechanism-ldp_epsilon-50"}
    assert not any(r.get("error") for r in rows.values())
    for name in ("mechanism-reps", "mechanism-kanon"):
        float(rows[name]["attack_advantage_psnr"])  # a number: the source (reps) or the best member (kanon)
    assert rows["mechanism-ldp_epsilon-50"]["attack_advantage_psnr"] == ""  # a DP release's members are unknown
    assert all(math.isfinite(float(r["attack_advantage_psnr_client"])) for r in rows.values())  # every mechanism
    ldp = rows["mechanism-ldp_epsilon-50"]  # two releases (rounds 0 and 1) share the budget
    assert 0 < float(ldp["epsilon_per_release"]) < float(ldp["epsilon_budget"]) == 50.0
    assert rows["mechanism-kanon"]["epsilon_per_release"] == ""  # not DP
    attack = json.loads((tmp_path / "out" / "cells" / "mechanism-kanon-seed0" / "run" / "attack.json").read_text())
    assert attack["attack"]["steps"] == 5  # the study's attack settings reached the attack
    assert all((tmp_path / "out" / picture).is_file()
               for picture in ("accuracy-by-setting.png", "accuracy-vs-attack.png", "accuracy-vs-epsilon.png"))
