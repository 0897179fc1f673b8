"""Progress: plain lines off a terminal (as before), rich bars on one, and a `done` line with epsilon and wall time."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from privfed.cli_progress import ProgressView, RoundProgress
from privfed.evaluation.linear_probe import linear_probe_accuracy
from privfed.run.evaluation import evaluate_run

ROUND_LINE = re.compile(r"^round +\d+  clients \d+/\d+(  loss \d+\.\d{4})?(  kNN \d\.\d{4})?  eps \d+\.\d{3}  \d+\.\ds$")
DONE_LINE = re.compile(
    r"^done: kNN accuracy \d\.\d{4} \(untrained \d\.\d{4}\) after 2 rounds, epsilon (\d+\.\d{3}) spent "
    r"\(worst-case client\), in (\d+)s \(training (\d+)s\) -> (.+)$"
)


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A tiny ldp run of the real CLI, its stdout captured (not a terminal)."""
    out = tmp_path_factory.mktemp("progress") / "run"
    result = subprocess.run(
        [sys.executable, "-m", "privfed.cli", "train", "--dataset", "shapes:300", "--num-clients", "4",
         "--participation", "1.0", "--rounds", "2", "-L", "4", "-G", "8", "--memory-size", "32", "--batch-size", "16",
         "--local-epochs", "1", "--projection-dim", "16", "--mechanism", "ldp", "--epsilon", "5", "--device", "cpu",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result.stdout.splitlines()


def test_off_a_terminal_each_round_is_one_plain_line(dp_run):
    _, lines = dp_run
    rounds = [line for line in lines if line.startswith("round")]
    assert [int(line.split()[1]) for line in rounds] == [0, 1, 2]
    assert all(ROUND_LINE.match(line) for line in rounds), rounds
    assert not any("\x1b" in line or "━" in line for line in lines)


def test_the_done_line_names_the_epsilon_spent_and_the_process_wall_time(dp_run):
    out, lines = dp_run
    summary = json.loads((out / "summary.json").read_text())
    done = DONE_LINE.match(lines[-1])
    assert done, lines[-1]
    assert float(done.group(1)) == pytest.approx(summary["privacy"]["epsilon"], abs=1e-3)
    assert int(done.group(2)) >= round(summary["wall_seconds"]) == int(done.group(3))
    assert done.group(4) == str(out)


def _replay(run: Path, console: Console) -> str:
    """The run's recorded events, drawn by the CLI's view on ``console``."""
    summary = json.loads((run / "summary.json").read_text())
    progress = RoundProgress(ProgressView(console))
    progress({"event": "start", "knn_accuracy_init": summary["knn_accuracy_init"], "rounds": 2})
    for line in (run / "metrics.jsonl").read_text().splitlines():
        progress({"event": "round", **json.loads(line)})
    progress({"event": "finish", **summary})
    return console.file.getvalue()


def test_a_replayed_run_prints_the_lines_the_cli_printed(dp_run):
    run, lines = dp_run
    plain = _replay(run, Console(file=io.StringIO(), force_terminal=False)).splitlines()
    start = lines.index(plain[0])
    assert plain[:-1] == lines[start:-1]  # the done line's wall time is this process's


def test_on_a_terminal_the_rounds_get_a_bar_with_an_eta_above_which_the_lines_stay(dp_run):
    run, _ = dp_run
    text = _replay(run, Console(file=io.StringIO(), force_terminal=True, width=120))
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert "rounds" in plain and "ETA" in plain and "2/2" in plain and "━" in plain
    assert re.search(r"round +2  clients 4/4", plain) and "done: kNN accuracy" in plain


def test_attack_stages_are_plain_lines_off_a_terminal_and_bars_on_one():
    plain = Console(file=io.StringIO(), force_terminal=False)
    view = ProgressView(plain)
    for done in (100, 200):
        view.attack_step("decoder", done, 200, {"mse": 0.05})
    assert plain.file.getvalue() == "  decoder: 100/200  mse 0.0500\n  decoder: 200/200  mse 0.0500\n"
    terminal = Console(file=io.StringIO(), force_terminal=True, width=120)
    view = ProgressView(terminal)
    view.attack_step("decoder", 100, 200, {"mse": 0.05})
    view.close()
    assert "decoder" in terminal.file.getvalue() and "100/200" in terminal.file.getvalue()
    assert "decoder: 100/200" not in terminal.file.getvalue()


def test_the_linear_probe_reports_its_one_fit():
    generator = torch.Generator().manual_seed(0)
    features, labels = torch.randn(40, 8, generator=generator), torch.arange(40) % 4
    heard: list[tuple[str, int, int]] = []
    linear_probe_accuracy(features, labels, features, labels,
                          progress=lambda stage, done, total, figures: heard.append((stage, done, total)))
    assert heard == [("linear probe", 1, 1)]


def test_evaluate_run_passes_the_probes_progress_on(dp_run):
    run, _ = dp_run
    heard: list[tuple[str, int, int]] = []
    evaluate_run(run, train_data="shapes:300", test_data="shapes:300", protocol="linear", device="cpu",
                 progress=lambda stage, done, total, figures: heard.append((stage, done, total)))
    assert heard and heard[-1][1] == heard[-1][2] and {stage for stage, _, _ in heard} == {"linear probe"}
