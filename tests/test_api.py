"""The Python API: the README's quickstart runs as written, library calls leave process-wide state alone, and bad
input is a PrivfedError."""

from __future__ import annotations

import csv
import json
import logging
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Self

import numpy as np
import pytest
import torch

# The modules the calls load, imported first: importing Flower sets its logger's level and adds warning filters
# (Flower's own doing, once per process); the tests check that the calls themselves change nothing.
import attacks.evaluation  # noqa: F401
import privfed
import privfed.federation.simulation
import privfed.run.evaluation
from privfed import PrivfedError

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "dataset": "shapes:200", "num_clients": 2, "participation": 1.0, "rounds": 1, "local_epochs": 1, "batch_size": 16,
    "projection_dim": 16, "memory_size": 32, "num_local_centroids": 4, "num_global_centroids": 8, "secagg": False,
    "device": "cpu",
}


def readme_quickstart() -> str:
    """The first ```python block of the README's "## Python quickstart" section."""
    section = (REPO / "README.md").read_text().split("## Python quickstart\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "no python block in the README's quickstart"
    return match.group(1)


class ProcessState:
    """What a library call must leave alone: the flwr logger's level, the warning filters, the Ctrl-C handlers.

    Entering installs a level and handlers of the test's own, so a call that sets its own is seen.
    """

    def __enter__(self) -> Self:
        self.flwr = logging.getLogger("flwr")
        self.saved_level = self.flwr.level
        self.flwr.setLevel(logging.INFO)

        def mine(signum, frame):  # never called
            raise AssertionError("the test's handler ran")

        self.handler = mine
        self.saved_handlers = {sig: signal.signal(sig, mine) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.filters = list(warnings.filters)
        return self

    def handlers(self) -> dict[signal.Signals, object]:
        return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def assert_untouched(self) -> None:
        assert self.flwr.level == logging.INFO
        assert warnings.filters == self.filters
        assert self.handlers() == {signal.SIGINT: self.handler, signal.SIGTERM: self.handler}

    def __exit__(self, *exc) -> None:
        self.flwr.setLevel(self.saved_level)
        for sig, handler in self.saved_handlers.items():
            signal.signal(sig, handler)


def test_the_readme_quickstart_is_the_example_and_runs_as_written(tmp_path, monkeypatch, capsys):
    code = readme_quickstart()
    assert code == (REPO / "examples" / "quickstart.py").read_text()
    monkeypatch.chdir(tmp_path)
    with ProcessState() as state:
        exec(compile(code, "README.md quickstart", "exec"), {"__name__": "__main__"})
        state.assert_untouched()
    printed = capsys.readouterr().out
    run = tmp_path / "runs" / "quickstart"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_early"] is None and summary["rounds"] == 1
    (evaluation,) = json.loads((run / "evaluation.json").read_text())["evaluations"]
    assert f"kNN accuracy: {evaluation['accuracy']}" in printed
    assert evaluation["train_data"] == evaluation["test_data"] == "shapes:300"  # the run's own data by default
    attacked = json.loads((run / "attack.json").read_text())
    assert attacked["rounds"][-1]["vectors"] == 8 and (run / "attack.png").is_file()
    assert f"(dB): {attacked['rounds'][-1]['advantage_psnr_best_member']}" in printed


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny run trained through the API, with what the process looked like during and after it."""
    out = tmp_path_factory.mktemp("api") / "run"
    seen = []
    with ProcessState() as state:
        torch.manual_seed(1234)
        np.random.seed(1234)
        expected = (torch.rand(3), np.random.rand(3))
        torch.manual_seed(1234)
        np.random.seed(1234)
        run = privfed.train(privfed.TrainConfig(**TINY), out=out, progress=lambda event: seen.append(
            (event["event"], state.handlers(), logging.getLogger("flwr").level)
        ))
        drawn = (torch.rand(3), np.random.rand(3))
        after = (state.handlers(), logging.getLogger("flwr").level, warnings.filters == state.filters)
    return run, state.handler, seen, after, (expected, drawn)


def test_a_run_from_python_keeps_the_callers_handlers_and_restores_flowers_log_level(tiny_run):
    run, mine, seen, after, _ = tiny_run
    assert [event for event, _, _ in seen] == ["start", "round", "round", "finish"]
    for _, handlers, level in seen:  # during the run: no Ctrl-C handler of privfed's; Flower quiet
        assert handlers == {signal.SIGINT: mine, signal.SIGTERM: mine} and level == logging.ERROR
    assert after == ({signal.SIGINT: mine, signal.SIGTERM: mine}, logging.INFO, True)
    assert run.summary == json.loads((run.path / "summary.json").read_text())
    assert privfed.Run.open(run.path) == run and run.config.num_clients == 2


def test_a_run_from_python_leaves_the_global_random_generators_where_they_were(tiny_run):
    (expected_torch, expected_numpy), (torch_draw, numpy_draw) = tiny_run[-1]
    assert torch.equal(torch_draw, expected_torch) and np.array_equal(numpy_draw, expected_numpy)


def test_the_encoder_loads_as_a_module_giving_features(tiny_run):
    import torch

    run = tiny_run[0]
    encoder = run.load_encoder()
    assert not encoder.training
    features = encoder(torch.rand(4, 3, 32, 32))
    assert features.shape[0] == 4 and features.ndim == 2
    initial = privfed.load_encoder(run.path, checkpoint="initial")
    assert not torch.equal(initial(torch.ones(1, 3, 32, 32)), encoder(torch.ones(1, 3, 32, 32)))


def test_bad_input_is_a_privfed_error_naming_the_problem(tiny_run, tmp_path):
    run = tiny_run[0]
    cases = [
        (lambda: privfed.train(privfed.TrainConfig(**TINY), out=run.path), "already holds a run"),
        (lambda: privfed.train(privfed.TrainConfig(**{**TINY, "rounds": 0})), "rounds must be at least 1"),
        (lambda: privfed.train(privfed.TrainConfig(**{**TINY, "rounds": "2"})), "'rounds' must be int"),
        (lambda: privfed.train(privfed.TrainConfig(**TINY), colour="red"), "unknown keys: colour"),
        (lambda: privfed.train(tmp_path / "missing.toml"), "config file not found"),
        (lambda: privfed.train({"rounds": 1}), "config must be a TrainConfig"),
        (lambda: privfed.load_encoder(tmp_path / "nothing"), "run directory not found"),
        (lambda: privfed.load_encoder(run, checkpoint="later"), "checkpoint not found"),
        (lambda: privfed.Run.open(tmp_path), "not a privfed run directory"),
        (lambda: privfed.evaluate(run, protocol="nearest"), "unknown protocol 'nearest'"),
        (lambda: privfed.evaluate(run, knn_k=0), "knn_k must be at least 1"),
        (lambda: privfed.attack(run, method="guess"), "guess"),
        (lambda: privfed.attack(run, settings={"stride": 2}), "attack decoder:"),
        (lambda: privfed.attack(run, steps=0), "steps must be at least 1"),
        (lambda: privfed.attack(run), "train with --record-releases"),
    ]
    for call, message in cases:
        with pytest.raises(PrivfedError, match=re.escape(message)):
            call()


def test_importing_privfed_loads_neither_torch_nor_flower():
    code = "import sys, privfed; print(privfed.__version__, 'torch' in sys.modules, 'flwr' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.split() == [privfed.__version__, "False", "False"]
    assert privfed.train is privfed.api.train and {"evaluate", "study", "tune"} <= set(dir(privfed))
    with pytest.raises(AttributeError):
        privfed.no_such_name  # noqa: B018


@pytest.mark.slow
def test_a_ray_run_from_python_puts_back_the_sigterm_handler_ray_replaces(tmp_path):
    """``ray.init`` installs a SIGTERM handler of its own for good; the run takes it back, and Ray's environment."""
    import os

    pytest.importorskip("ray")
    before = {name: os.environ.get(name) for name in ("RAY_DEDUP_LOGS", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO")}
    with ProcessState() as state:
        run = privfed.train(privfed.TrainConfig(**{**TINY, "runtime": "ray"}), out=tmp_path / "run")
        state.assert_untouched()
    assert run.summary["stopped_early"] is None
    assert {name: os.environ.get(name) for name in before} == before


def _without_wall_time(text: str) -> str:
    """``results.md`` less its table's ``wall_seconds`` column (the one figure two runs of a cell never share)."""
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| setting |"))
    column = [part.strip() for part in header.split("|")].index("wall_seconds")
    return "\n".join(
        "|".join(part for i, part in enumerate(line.split("|")) if i != column) if line.startswith("|") else line
        for line in lines
    )


def test_a_study_from_python_writes_what_privfed_study_writes_and_tune_ranks_it_alike(tmp_path, run_privfed):
    study_file = tmp_path / "tiny.toml"
    study_file.write_text("seeds = [0]\n[base]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in TINY.items()))
    command = run_privfed("study", str(study_file), "--out", str(tmp_path / "cli"))
    assert command.returncode == 0, command.stderr[-3000:]
    lines: list[str] = []
    with ProcessState() as state:
        result = privfed.study(study_file, out=tmp_path / "api", log=lines.append)
        state.assert_untouched()
    assert lines == ["[1/1] base-seed0 (0 done, 1 to run)"]
    assert [p.relative_to(result.folder) for p in result.written] == [
        Path("results.csv"), Path("results.md"), Path("accuracy-by-setting.png")]
    shown = ", ".join(str(tmp_path / "cli" / p.relative_to(result.folder)) for p in result.written)
    assert f"wrote {shown} (1 runs, 0 failed)" in command.stdout
    rows = {side: [{k: v for k, v in row.items() if k != "wall_seconds"}
                   for row in csv.DictReader((tmp_path / side / "results.csv").open())] for side in ("cli", "api")}
    assert rows["api"] == rows["cli"] and rows["api"][0]["knn"] and not rows["api"][0].get("error")
    assert _without_wall_time((tmp_path / "api" / "results.md").read_text()) == _without_wall_time(
        (tmp_path / "cli" / "results.md").read_text())
    # The cells are finished: tune trains nothing, and ranks both alike.
    tuned = privfed.tune(study_file, out=tmp_path / "api")
    command = run_privfed("tune", str(study_file), "--out", str(tmp_path / "cli"))
    assert command.returncode == 0, command.stderr[-3000:]
    assert tuned.ranking in command.stdout and f"wrote {tmp_path / 'cli' / 'tuning.md'}" in command.stdout
    assert tuned.path.read_text() == (tmp_path / "cli" / "tuning.md").read_text()
    assert tuned.study.records == result.records
