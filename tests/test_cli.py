"""The CLI's contract for bad input: one line naming the problem, non-zero exit, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from privfed.run.directory import RunDirectory


def assert_user_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    message = result.stderr.strip()
    assert message, result.stdout
    for needle in needles:
        assert needle in message, message


def write_npz(path: Path, **arrays: np.ndarray) -> str:
    np.savez(path, **arrays)
    return f"arrays:{path}"


@pytest.fixture
def images() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, size=(20, 8, 8, 3), dtype=np.uint8)


@pytest.mark.parametrize(
    "args,needles",
    [
        (["--dataset", "imagenet"], ["imagenet"]),
        (["--method", "fedprox"], ["unknown method", "fedprox"]),
        (["--mechanism", "magic"], ["unknown mechanism", "magic"]),
        (["--alpha", "0"], ["alpha"]),
        (["--alpha", "-1"], ["alpha"]),
        (["--participation", "0"], ["participation"]),
        (["--participation", "1.5"], ["participation"]),
        (["--config", "no/such/file.toml"], ["config file not found"]),
        (["--dataset", "shapes:50", "--num-clients", "60", "-G", "8"], ["clients"]),
        (["--device", "tpu"], ["device"]),
    ],
)
def test_train_rejects_bad_input(args, needles, run_privfed):
    assert_user_error(run_privfed("train", *args), *needles)


def test_npz_without_labels(tmp_path, images, run_privfed):
    spec = write_npz(tmp_path / "nolabels.npz", x=images)
    assert_user_error(run_privfed("train", "--dataset", spec), "y")


def test_npz_without_images(tmp_path, run_privfed):
    spec = write_npz(tmp_path / "noimages.npz", y=np.zeros(5, dtype=np.int64))
    assert_user_error(run_privfed("train", "--dataset", spec), "x")


def test_npz_with_mismatched_lengths(tmp_path, images, run_privfed):
    spec = write_npz(tmp_path / "mismatch.npz", x=images, y=np.zeros(19, dtype=np.int64))
    assert_user_error(run_privfed("train", "--dataset", spec), "20", "19")


def test_train_refuses_to_reuse_a_run_directory(tmp_path, run_privfed):
    (tmp_path / "config.json").write_text("{}")
    assert_user_error(run_privfed("train", "--out", str(tmp_path)), "already holds a run")


def test_config_file_with_unknown_key(tmp_path, run_privfed):
    config = tmp_path / "bad.toml"
    config.write_text('dataset = "shapes"\nlearning_rate = 0.1\n')
    assert_user_error(run_privfed("train", "--config", str(config)), "learning_rate")


def test_cifar_without_download_names_the_missing_directory(tmp_path, run_privfed):
    result = run_privfed("train", "--dataset", "cifar10", "--data-dir", str(tmp_path / "nowhere"))
    assert_user_error(result, "nowhere", "--download")


def test_evaluate_rejects_a_missing_run_directory(tmp_path, run_privfed):
    result = run_privfed("evaluate", str(tmp_path / "missing"), "--train-data", "shapes", "--test-data", "shapes")
    assert_user_error(result, "missing")


def test_evaluate_rejects_an_unknown_protocol(tmp_path, run_privfed):
    result = run_privfed(
        "evaluate", str(tmp_path), "--train-data", "shapes", "--test-data", "shapes", "--protocol", "svm"
    )
    assert_user_error(result, "svm")


def test_train_help_documents_every_option(run_privfed):
    import dataclasses

    from privfed.config import TrainConfig

    result = run_privfed("train", "--help")
    assert result.returncode == 0
    for field in dataclasses.fields(TrainConfig):
        assert "--" + field.name.replace("_", "-") in result.stdout, field.name


def test_version_prints_the_packages_version(run_privfed):
    from importlib.metadata import version

    result = run_privfed("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"privfed {version('privfed')}"


def test_mechanisms_lists_kanon(run_privfed):
    result = run_privfed("mechanisms")
    assert result.returncode == 0
    assert "kanon" in result.stdout


def test_a_run_directory_in_use_is_not_resumed(tmp_path, run_privfed):
    (tmp_path / "config.json").write_text("{}")  # a run's folder (one that holds none is refused before its lock)
    with RunDirectory(tmp_path).claimed():  # as a training process holds it
        assert_user_error(run_privfed("train", "--resume", str(tmp_path)), "in use by another privfed process")


def test_an_unexpected_error_exits_even_when_a_thread_is_left_waiting():
    """A runtime that fails can leave a thread waiting forever (Ray's did, for --client-gpus without a GPU):
    the traceback is shown and the process exits instead of hanging in threading._shutdown."""
    script = (
        "import threading\n"
        "from privfed import cli\n"
        "@cli.app.command()\n"
        "def crash() -> None:\n"
        "    threading.Thread(target=threading.Event().wait).start()  # never ends, and is no daemon\n"
        "    raise RuntimeError('a bug')\n"
        "cli.main(['crash'])\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "RuntimeError: a bug" in result.stderr


def test_a_run_in_which_no_client_can_train_stops_with_its_reason_and_exit_1(tmp_path, run_privfed):
    """A temperature of 1e-300 makes every client's loss non-finite, so each training round's client fails:
    the run stops after the first such round with a summary that says why, instead of running every round
    with 0 clients and ending "done" with exit 0. (A process that hung would time out here.)"""
    out = tmp_path / "run"
    result = run_privfed(
        "train", "--dataset", "shapes:300", "--num-clients", "4", "--participation", "1.0", "--rounds", "3", "-L", "4",
        "-G", "8", "--memory-size", "32", "--batch-size", "16", "--local-epochs", "1", "--projection-dim", "16",
        "--temperature", "1e-300", "--out", str(out), timeout=300,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    stopped = json.loads((out / "summary.json").read_text())["stopped_early"]
    assert stopped.startswith("round 1: no usable reply from its 4 sampled clients (4 failed")
    # (Flower logs each client's failure, with its traceback, above; privfed's own last word is one line.)
    assert result.stderr.splitlines()[-1].startswith(f"error: the run failed: {stopped}")
    assert [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]
