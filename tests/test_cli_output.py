"""Output that cannot kill a command: a closed stdout or stderr stops the printing (real processes, real pipes), and
a result that could not be written is refused before it is computed (a real read-only folder)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from privfed.cli import main
from privfed.cli_streams import ForgivingStream

#: A run of two rounds in about twenty seconds, that records its releases (so `attack` has something to invert).
TINY_RUN = ("--dataset", "shapes:300", "--num-clients", "4", "--participation", "1.0", "--backbone", "resnet8",
            "--projection-dim", "16", "--batch-size", "16", "--memory-size", "32", "--num-local-centroids", "4",
            "--num-global-centroids", "8", "--rounds", "2", "--device", "cpu", "--record-releases")


def privfed(*args: str, **popen: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "privfed.cli", *args], **popen)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run trained to its end with its output discarded, for the commands that read a run."""
    run = tmp_path_factory.mktemp("streams") / "run"
    process = privfed("train", *TINY_RUN, "--out", str(run), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert process.wait(timeout=600) == 0
    return run


@pytest.mark.slow
def test_a_run_whose_reader_closed_the_pipe_trains_to_the_end(tmp_path):
    """``privfed train ... 2>&1 | head -1``: the reader takes one line and closes the pipe."""
    run = tmp_path / "run"
    process = privfed("train", *TINY_RUN, "--out", str(run), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    first = process.stdout.readline()
    process.stdout.close()
    assert first.startswith(b"privfed: "), first
    assert process.wait(timeout=600) == 0
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
])
def test_other_commands_end_as_they_would_with_nobody_reading(command, finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)  # the shared run stays as trained
    write = closed_pipe()
    argv = [a.replace("{run}", str(run)).replace("{tmp}", str(tmp_path)) for a in command]
    process = privfed(*argv, stdout=write, stderr=write, cwd=tmp_path)
    os.close(write)
    assert process.wait(timeout=600) == 0
    if command[0] == "plot":
        assert (tmp_path / "p.png").is_file()
    if command[0] == "attack":
        assert (run / "attack.json").is_file()


@pytest.mark.parametrize("command,code", [
    (("datasets",), 0),
    (("train", "--help"), 0),
    (("train", "--lr", "nan"), 2),  # the error line itself goes to a closed stderr
])
@pytest.mark.parametrize("stream", ["closed pipe", "full disk"])
def test_quick_commands_end_as_they_would_with_nobody_reading(command, code, stream, tmp_path):
    """A pipe whose reader left (EPIPE), and /dev/full: every write fails as on a full disk (ENOSPC)."""
    write = closed_pipe() if stream == "closed pipe" else os.open("/dev/full", os.O_WRONLY)
    process = privfed(*command, stdout=write, stderr=write, cwd=tmp_path)
    os.close(write)
    assert process.wait(timeout=300) == code


def test_a_stream_whose_reader_left_stops_printing_and_drains_into_dev_null():
    stream = ForgivingStream(os.fdopen(closed_pipe(), "w"))
    stream.write("one line\n")
    stream.flush()  # EPIPE: turned off, not raised
    assert stream.closed_by_reader
    assert os.readlink(f"/proc/self/fd/{stream.fileno()}") == os.devnull
    stream.write("more\n")
    stream.flush()
    stream.close()


TINY_STUDY = ('seeds = [0]\n[base]\ndataset = "shapes:300"\nnum_clients = 4\nparticipation = 1.0\n'
              'backbone = "resnet8"\nprojection_dim = 16\nbatch_size = 16\nmemory_size = 32\n'
              'num_local_centroids = 4\nnum_global_centroids = 8\nrounds = 1\ndevice = "cpu"\n')


@pytest.mark.slow
def test_a_study_runs_its_cell_with_nobody_reading(tmp_path):
    study = tmp_path / "study.toml"
    study.write_text(TINY_STUDY)
    write = closed_pipe()
    process = privfed("study", str(study), "--out", str(tmp_path / "out"), stdout=write, stderr=write, cwd=tmp_path)
    os.close(write)
    assert process.wait(timeout=600) == 0
    assert (tmp_path / "out" / "results.csv").is_file()


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only for this process: mode 555, or for root (whom modes do not stop) a read-only bind mount."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode != 0:
        pytest.skip("root, and mount is not allowed here: no honest read-only folder")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("root, and a read-only remount is not allowed here")
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def nothing_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if `evaluate` reaches its features or `attack` its auxiliary data."""
    import attacks.evaluation
    import privfed.run.evaluation

    def reached(*args: object, **kwargs: object) -> None:
        pytest.fail("computed a result it cannot write")

    for name in ("extract_features", "fine_tune_accuracy"):
        monkeypatch.setattr(privfed.run.evaluation, name, reached)
    monkeypatch.setattr(attacks.evaluation, "load_auxiliary", reached)


RESULT_COMMANDS = {
    "evaluate": ("evaluate", "{run}", "--train-data", "shapes:300", "--test-data", "shapes:300", "--device", "cpu"),
    "tsne": ("evaluate", "{run}", "--protocol", "tsne", "--test-data", "shapes:300", "--device", "cpu"),
    "attack": ("attack", "{run}", "--method", "decoder", "--device", "cpu"),
}


def refused(argv: tuple[str, ...], run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of ``argv`` on ``run`` (exit 2, nothing on stdout)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main([a.replace("{run}", str(run)) for a in argv])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and captured.out == "", (exit_.value.code, captured)
    (line,) = captured.err.splitlines()
    assert line.startswith("error: cannot write ") and "Traceback" not in captured.err, captured.err
    return line


@pytest.mark.slow
@pytest.mark.parametrize("command", RESULT_COMMANDS)
def test_a_result_for_a_read_only_run_folder_is_refused_before_it_is_computed(command, finished_run, tmp_path,
                                                                              nothing_computed, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    with read_only(run):
        line = refused(RESULT_COMMANDS[command], run, capsys)
    assert str(run) in line


@pytest.mark.slow
@pytest.mark.parametrize("name", ["attack.json", "attack.png"])
def test_an_attack_whose_result_name_is_a_folder_is_refused_before_it_runs(name, finished_run, tmp_path,
                                                                           nothing_computed, capsys):
    """On a run with recorded releases, so nothing but the folder stops it."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / name).mkdir()
    assert name in refused(RESULT_COMMANDS["attack"], run, capsys)


def with_file_size_limit(limit: int) -> Callable[[], None]:
    """A child's set-up: no file it writes may grow past ``limit`` bytes, as on a full disk the write fails
    (EFBIG, an OSError: SIGXFSZ, which would kill the process instead, is ignored)."""

    def set_up() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return set_up


def ended(argv: list[str], **popen: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "privfed.cli", *argv], capture_output=True, text=True, timeout=600,
                          **popen)


def assert_whole_files(run: Path) -> None:
    """No temporary file left behind, and every JSON-lines file ends in a whole line."""
    assert not list(run.rglob("*.tmp")), list(run.rglob("*.tmp"))
    for lines in run.rglob("*.jsonl"):
        for line in lines.read_text().splitlines():
            json.loads(line)


@pytest.mark.slow
def test_a_full_disk_before_the_first_resume_point_is_one_line_that_says_to_start_again(tmp_path):
    run = tmp_path / "run"
    result = ended(["train", *TINY_RUN, "--out", str(run)], preexec_fn=with_file_size_limit(100_000))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    assert line == (f"error: cannot write in {run}: File too large; make room, then remove {run} and train again "
                    "(it stopped before its first resume point)")
    assert_whole_files(run)


@pytest.mark.slow
def test_a_full_disk_mid_run_is_one_line_whose_advice_holds(finished_run, tmp_path):
    """The resumed run's second round cannot write its files: one line, whole files, and what it says is so."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    result = ended(["train", "--resume", str(run), "--rounds", "3"], preexec_fn=with_file_size_limit(100_000))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    line = result.stderr.splitlines()[-1]
    assert line.startswith(f"error: cannot write in {run}: File too large; "), result.stderr
    assert_whole_files(run)
    again = ended(["train", "--resume", str(run), "--rounds", "3"])
    if "continues it from its last resume point" in line:
        assert again.returncode == 0, again.stderr
    else:
        assert "the run cannot be resumed: " in line
        assert again.returncode == 2 and again.stderr.strip() == "error: " + line.split("cannot be resumed: ", 1)[1]


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A file system of ``size`` at ``folder`` (a tmpfs: root only); skips where mounting is not allowed."""
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root and a mount this machine allows")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.slow
def test_a_disk_that_fills_mid_run_is_one_line_whose_advice_holds_once_there_is_room(tmp_path):
    """A real ENOSPC: a 1.6 MB disk holds the first checkpoints, then fills in round 1."""
    with small_disk(tmp_path / "disk", "1600k") as disk:
        run = disk / "run"
        result = ended(["train", *TINY_RUN, "--out", str(run)])
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        line = result.stderr.splitlines()[-1]
        assert line.startswith(f"error: cannot write in {run}: No space left on device; "), result.stderr
        assert_whole_files(run)
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # room made
        again = ended(["train", "--resume", str(run)])
        if "continues it from its last resume point" in line:
            assert again.returncode == 0, again.stderr
        elif "and train again" in line:
            assert not (run / "checkpoints" / "resume.pt").exists()
        else:
            assert "the run cannot be resumed: " in line
            assert again.returncode == 2
            assert again.stderr.strip() == "error: " + line.split("cannot be resumed: ", 1)[1]


@pytest.mark.slow
def test_a_study_value_too_long_for_a_folder_name_runs_even_with_warnings_as_errors(tmp_path):
    """The cell's folder name is cut (with a hash), and its long label squeezes the plots without a fatal warning."""
    data_dir = "/" + "/".join(["d" * 50] * 6)  # a valid path; as a cell name, over 255 bytes
    study = tmp_path / "study.toml"
    study.write_text(TINY_STUDY + f'[[grid]]\ndata_dir = ["{data_dir}"]\n')
    result = ended(["study", str(study), "--out", str(tmp_path / "out")], cwd=tmp_path,
                   env={**os.environ, "PYTHONWARNINGS": "error"})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    (cell,) = (tmp_path / "out" / "cells").iterdir()
    assert len(cell.name.encode()) <= 255 and (cell / "cell.json").is_file()
    assert (tmp_path / "out" / "results.csv").is_file()
