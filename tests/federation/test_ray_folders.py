"""Ray's folders: one per simulation, in the temporary directory, and those of runs killed with `kill -9` go at the
next start (issue 28, item 8). The Ray runs themselves are in tests/run/test_interruption.py and tests/run/test_kill_resume.py."""

from __future__ import annotations

import os
import subprocess
import sys

from privfed.federation.simulation import RAY_FOLDER_PREFIX, remove_abandoned_ray_folders


def dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_only_folders_whose_driver_is_gone_are_removed(tmp_path):
    gone = tmp_path / f"{RAY_FOLDER_PREFIX}gone"
    (gone / f"session_2026-11-26_08-09-54_243130_{dead_pid()}" / "sockets").mkdir(parents=True)
    (gone / "session_latest").symlink_to(next(gone.iterdir()))
    alive = tmp_path / f"{RAY_FOLDER_PREFIX}alive"
    (alive / f"session_2026-11-26_08-09-54_243130_{os.getpid()}").mkdir(parents=True)
    starting = tmp_path / f"{RAY_FOLDER_PREFIX}starting"  # mkdtemp'd, Ray not started yet
    starting.mkdir()
    other = tmp_path / f"other_session_1_{dead_pid()}"
    other.mkdir()
    assert remove_abandoned_ray_folders(tmp_path) == [gone]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, starting.name, other.name])
