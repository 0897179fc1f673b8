"""Runs a study cell by cell into one directory; a finished cell is not run again while its configuration stands.

``cells/<setting>-seed<seed>/cell.json``, written whole, marks a cell finished; a changed study file makes it stale
(docs/studies.md, "Stopping and failures"). What a cell does is the caller's :data:`CellWork`.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from privfed.config import read_json_object, with_legacy_settings
from privfed.durable import make_folder, write_json
from privfed.errors import PrivfedError
from privfed.studies.grid import Cell, Study, settings_changes, settings_hash

CELL_FILE = "cell.json"
#: Written when a cell's work starts: the settings its leftovers (a stopped run) were made with.
ATTEMPT_FILE = "attempt.json"
#: How many stale cells an error names before it counts the rest.
STALE_LISTED = 8

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
    config_hash: str | None = None  # None: recorded before privfed kept it
    settings: dict[str, Any] | None = None  # what the hash is of (:meth:`Study.cell_settings`)
    overrides: dict[str, Any] | None = None  # the setting's own options, for its label in pictures

    @property
    def finished(self) -> bool:
        return self.error is None and self.row is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StaleCells(PrivfedError):
    """Finished cells whose configuration is not the study file's now (or is unknown); nothing was run."""


def cell_folder(out: Path, cell: Cell) -> Path:
    return out / "cells" / cell.run_name


#: ``cell.json``'s keys, each with the types its value may have.
RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,), "seed": (int,), "row": (dict, type(None)), "error": (str, type(None)), "seconds": (int, float),
    "config_hash": (str, type(None)), "settings": (dict, type(None)), "overrides": (dict, type(None)),
}
#: Keys of ``cell.json`` that records written before privfed kept the configuration may lack.
OPTIONAL_RECORD_FIELDS = ("config_hash", "settings", "overrides")


def read_record(folder: Path) -> CellRecord | None:
    """The cell's recorded outcome, or None when it has none (never run, or stopped mid-way).

    privfed writes ``cell.json`` whole, so a damaged one was changed by something else: it is refused (PrivfedError
    naming it), not rerun over, so the user decides what it held.
    """
    path = folder / CELL_FILE
    if not path.is_file():
        return None
    redo = "delete the cell's folder to run it again"
    try:
        values = read_json_object(path)
    except PrivfedError as err:
        raise PrivfedError(f"{err}; {redo}") from None
    for key, kinds in RECORD_FIELDS.items():
        if key not in values and key in OPTIONAL_RECORD_FIELDS:
            continue
        if key not in values or not isinstance(values[key], kinds) or isinstance(values[key], bool):
            raise PrivfedError(f"{path} is damaged ({key!r} missing or of the wrong type); {redo}")
    return CellRecord(values["name"], values["seed"], values["row"], values["error"], values["seconds"],
                      values.get("config_hash"), values.get("settings"), values.get("overrides"))


def recorded_cells(study: Study, out: Path) -> list[CellRecord]:
    """The records of the study's cells that have one, in the study's order: a stopped study's results so far."""
    records = ((cell, read_record(cell_folder(out, cell))) for cell in study.cells())
    return [replace(record, overrides=cell.overrides) for cell, record in records if record is not None]


def stale_reason(record: CellRecord, settings: dict[str, Any]) -> str | None:
    """Why a finished cell's results may not be what the study asks for now; None when its hash matches."""
    if record.config_hash is None:
        return "stale-unknown: recorded before privfed kept each cell's configuration hash"
    before = {**settings, "train": with_legacy_settings(settings["train"])}  # as cells recorded it before
    if record.config_hash in (settings_hash(settings), settings_hash(before)):
        return None
    changes = settings_changes(record.settings, settings) if record.settings is not None else []
    return "; ".join(changes) if changes else "its configuration hash differs"


def check_stale(study: Study, out: Path, *, reuse_stale: bool) -> list[tuple[Cell, str]]:
    """The finished cells whose configuration changed (or is unknown), each with why; StaleCells, naming them and
    what to do, unless ``reuse_stale``."""
    stale = []
    for cell in study.cells():
        record = read_record(cell_folder(out, cell))
        if record is not None and record.finished and (why := stale_reason(record, study.cell_settings(cell))):
            stale.append((cell, why))
    if stale and not reuse_stale:
        listed = [f"  {cell.run_name}: {why}" for cell, why in stale[:STALE_LISTED]]
        if len(stale) > STALE_LISTED:
            listed.append(f"  ... and {len(stale) - STALE_LISTED} more")
        raise StaleCells(
            f"{out} holds {len(stale)} finished cell(s) whose configuration is not the study file's now:\n"
            + "\n".join(listed)
            + f"\nNothing was run. To redo a cell, delete its folder ({out / 'cells'}/<cell>) or use another --out; "
            "to keep their results, pass --reuse-stale."
        )
    return stale


def write_record(folder: Path, record: CellRecord) -> None:
    """Writes ``cell.json`` whole (a temporary file renamed over it), so a kill never leaves half a record."""
    write_json(make_folder(folder) / CELL_FILE, record.to_dict())


def _attempt_hash(folder: Path, record: CellRecord | None) -> str | None:
    """The configuration hash what is in ``folder`` was made with: its failed record's, else its attempt's."""
    if record is not None and record.config_hash is not None:
        return record.config_hash
    attempt = folder / ATTEMPT_FILE
    try:  # a damaged attempt is one of unknown configuration: the cell starts again
        config_hash = read_json_object(attempt).get("config_hash") if attempt.is_file() else None
    except PrivfedError:
        return None
    return config_hash if isinstance(config_hash, str) else None


def run_study(
    study: Study, out: Path, work: CellWork, *, progress: Progress | None = None, reuse_stale: bool = False
) -> list[CellRecord]:
    """Runs every cell that has not finished, in the study's order; returns every cell's record.

    Stale cells are refused (:func:`check_stale`) unless ``reuse_stale``, and a stopped attempt under another
    configuration starts again. Progress lines estimate the time left from the cells timed in this run.
    """
    cells = study.cells()
    stale = check_stale(study, out, reuse_stale=reuse_stale)
    if stale and progress is not None:
        progress(f"keeping {len(stale)} finished cell(s) whose configuration changed or is unknown (--reuse-stale)")
    records: list[CellRecord] = []
    timed: list[float] = []
    for index, cell in enumerate(cells):
        folder = cell_folder(out, cell)
        settings = study.cell_settings(cell)
        config_hash = settings_hash(settings)
        previous = read_record(folder)
        if previous is not None and previous.finished:
            records.append(replace(previous, overrides=cell.overrides))
            continue
        if folder.exists() and not reuse_stale and _attempt_hash(folder, previous) != config_hash:
            if progress is not None:
                progress(f"  {cell.run_name}: its stopped attempt had another (or an unknown) configuration: starting again")
            shutil.rmtree(folder)
        write_json(make_folder(folder) / ATTEMPT_FILE, {"config_hash": config_hash, "settings": settings})
        if progress is not None:
            left = len(cells) - index
            eta = f", about {_duration(statistics.fmean(timed) * left)} left" if timed else ""
            progress(f"[{index + 1}/{len(cells)}] {cell.run_name} ({index} done, {left} to run{eta})")
        started = time.perf_counter()
        try:
            row, error = work(cell, folder), None
        except Exception as err:  # the study goes on; the record says why this cell has no row
            row, error = None, f"{type(err).__name__}: {err}"
        record = CellRecord(cell.name, cell.seed, row, error, time.perf_counter() - started, config_hash, settings,
                            cell.overrides)
        write_record(folder, record)
        timed.append(record.seconds)
        if progress is not None and error is not None:
            progress(f"  {cell.run_name} failed: {error}")
        records.append(record)
    return records


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"
