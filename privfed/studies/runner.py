"""Runs a study cell by cell into one directory; a finished cell is never run again.

Each cell (a setting at a seed, :mod:`privfed.studies.grid`) gets its own
folder, ``cells/<setting>-seed<seed>/``. When the cell's work returns, its
row is written to ``cell.json`` there, whole or not at all: that file is
what marks a cell finished. A cell that raised is recorded with its error
in the same file and the study goes on; a later run of the study tries it
again, and skips every finished one. What a cell does (train, evaluate,
attack) is the caller's :data:`CellWork`, so this module stays free of the
runtime and the attacks; it must cope with what a stopped attempt left in
the folder (resume the run, or start it again).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privfed.studies.grid import Cell, Study

CELL_FILE = "cell.json"

#: Does one cell's work in its folder and returns its row (numbers and short strings).
CellWork = Callable[[Cell, Path], dict[str, Any]]
#: Told what the study is doing, one line at a time.
Progress = Callable[[str], None]


@dataclass(frozen=True)
class CellRecord:
    """A cell's outcome as ``cell.json`` keeps it."""

    name: str
    seed: int
    row: dict[str, Any] | None
    error: str | None
    seconds: float

    @property
    def finished(self) -> bool:
        return self.error is None and self.row is not None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "row": self.row, "error": self.error, "seconds": self.seconds}


def cell_folder(out: Path, cell: Cell) -> Path:
    return out / "cells" / cell.run_name


def read_record(folder: Path) -> CellRecord | None:
    """The cell's recorded outcome, or None when it has none (never run, or stopped mid-way)."""
    path = folder / CELL_FILE
    if not path.is_file():
        return None
    values = json.loads(path.read_text())
    return CellRecord(values["name"], values["seed"], values["row"], values["error"], values["seconds"])


def recorded_cells(study: Study, out: Path) -> list[CellRecord]:
    """The records of the study's cells that have one, in the study's order: a stopped study's results so far."""
    records = (read_record(cell_folder(out, cell)) for cell in study.cells())
    return [record for record in records if record is not None]


def write_record(folder: Path, record: CellRecord) -> None:
    """Writes ``cell.json`` whole (a temporary file renamed over it), so a kill never leaves half a record."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{CELL_FILE}.tmp"
    tmp.write_text(json.dumps(record.to_dict(), indent=2) + "\n")
    os.replace(tmp, folder / CELL_FILE)


def run_study(study: Study, out: Path, work: CellWork, *, progress: Progress | None = None) -> list[CellRecord]:
    """Runs every cell that has not finished, in the study's order; returns every cell's record.

    Progress lines name the cell, how many are done and left, and an
    estimate of the time left from the cells timed in this run.
    """
    cells = study.cells()
    records: list[CellRecord] = []
    timed: list[float] = []
    for index, cell in enumerate(cells):
        folder = cell_folder(out, cell)
        previous = read_record(folder)
        if previous is not None and previous.finished:
            records.append(previous)
            continue
        if progress is not None:
            left = len(cells) - index
            eta = f", about {_duration(statistics.fmean(timed) * left)} left" if timed else ""
            progress(f"[{index + 1}/{len(cells)}] {cell.run_name} ({index} done, {left} to run{eta})")
        started = time.perf_counter()
        try:
            row, error = work(cell, folder), None
        except Exception as err:  # the study goes on; the record says why this cell has no row
            row, error = None, f"{type(err).__name__}: {err}"
        record = CellRecord(cell.name, cell.seed, row, error, time.perf_counter() - started)
        write_record(folder, record)
        timed.append(record.seconds)
        if progress is not None and error is not None:
            progress(f"  {cell.run_name} failed: {error}")
        records.append(record)
    return records


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"
