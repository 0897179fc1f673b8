"""A run directory is written by one privfed process at a time."""

from __future__ import annotations

import pytest

from privfed.errors import PrivfedError
from privfed.run.directory import RunDirectory


def test_a_claimed_run_directory_cannot_be_claimed_again_until_released(tmp_path):
    run_dir = RunDirectory(tmp_path)
    with run_dir.claimed(), pytest.raises(PrivfedError, match="in use by another privfed process"), RunDirectory(tmp_path).claimed():
        pass
    with run_dir.claimed():  # released at the end of the block
        pass


def test_a_missing_directory_cannot_be_claimed(tmp_path):
    with pytest.raises(PrivfedError, match="is not a directory"), RunDirectory(tmp_path / "absent").claimed():
        pass
    assert not (tmp_path / "absent").exists()


def test_concurrent_evaluations_keep_every_entry(tmp_path):
    import json
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=4) as pool:
        list(pool.map(_append_one, [(str(tmp_path), i) for i in range(24)]))
    entries = json.loads((tmp_path / "evaluation.json").read_text())["evaluations"]
    assert sorted(e["index"] for e in entries) == list(range(24))


def _append_one(args: tuple[str, int]) -> None:
    path, index = args
    RunDirectory(path).append_evaluation({"index": index})


def test_a_new_run_directory_is_on_disk_under_its_name_before_its_ledger_is(tiny_config, tmp_path, synced):
    """The ledger's name is flushed into the run directory; the directory's own name must be too, or a crash takes the
    whole run, its spent budget with it."""
    from privfed.durable import make_directory

    run = tmp_path / "runs" / "a"
    make_directory(run, kind="run directory")
    RunDirectory(run).create(tiny_config)
    assert {str(tmp_path), str(tmp_path / "runs"), str(run)} <= {path for path, folder in synced if folder}
