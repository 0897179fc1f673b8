"""Durable writes: the data and the name are flushed to disk before the call returns."""

from __future__ import annotations

from pathlib import Path

import pytest

from privfed.durable import append_line, locked, make_folder, write_whole


def test_a_whole_write_flushes_the_file_then_its_folder(tmp_path, synced):
    path = tmp_path / "summary.json"
    write_whole(path, lambda tmp: tmp.write_text("{}"))
    assert path.read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    assert synced == [(str(tmp_path / ".summary.json.tmp"), False), (str(tmp_path), True)]


def test_a_failed_whole_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("old")

    def half(tmp: Path) -> None:
        tmp.write_text("ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_whole(path, half)
    assert path.read_text() == "old"


def test_an_appended_line_is_flushed_and_a_new_files_name_too(tmp_path, synced):
    path = tmp_path / "ledger.jsonl"
    append_line(path, "a")
    assert synced == [(str(path), False), (str(tmp_path), True)]
    synced.clear()
    append_line(path, "b")
    assert synced == [(str(path), False)] and path.read_text() == "a\nb\n"


def _try_lock_elsewhere(path: Path) -> str:
    """Whether another process can take the lock on ``path`` now: "free" or "held"."""
    import subprocess
    import sys

    probe = (
        "import fcntl, sys\n"
        "f = open(sys.argv[1], 'a')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\n"
        "except BlockingIOError:\n    print('held')\n"
    )
    return subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True).stdout.strip()


def test_the_lock_excludes_another_process_while_held_and_only_then(tmp_path):
    path = tmp_path / "ledger.lock"
    with locked(path):
        assert _try_lock_elsewhere(path) == "held"
    assert _try_lock_elsewhere(path) == "free"
    with pytest.raises(RuntimeError), locked(path):
        raise RuntimeError("the round failed")
    assert _try_lock_elsewhere(path) == "free"


def test_a_process_forked_inside_the_lock_does_not_hold_it_after_the_block(tmp_path):
    """A fork inherits the lock's file: released only by its close, the lock would stay held as long as the child lives
    (a plug-in's worker process, say), and the next round of the partition would wait for it."""
    import os
    import signal

    path = tmp_path / "replies.lock"
    with locked(path):
        child = os.fork()
        if child == 0:  # pragma: no cover (the child only waits)
            import time

            time.sleep(30)
            os._exit(0)
    try:
        assert _try_lock_elsewhere(path) == "free"
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_a_new_folder_is_on_disk_under_its_name_and_its_new_parents_too(tmp_path, synced):
    folder = tmp_path / "state" / "privfed"
    assert make_folder(folder) == folder and folder.is_dir()
    assert synced == [(str(tmp_path), True), (str(tmp_path / "state"), True)]
    synced.clear()
    make_folder(folder)
    assert synced == []


def test_a_file_in_the_way_of_a_folder_is_an_error(tmp_path):
    (tmp_path / "state").write_text("")
    with pytest.raises(FileExistsError):
        make_folder(tmp_path / "state")
