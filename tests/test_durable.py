"""Durable writes: the data and the name are flushed to disk before the call returns."""

from __future__ import annotations

from pathlib import Path

import pytest

from privfed.durable import append_line, write_whole


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
