"""Runs a study into its directory, as ``privfed study`` and :func:`privfed.study` do, and writes its results.

What can fail before a cell trains fails first (the data, a cell's plan, the directory); the directory is then
held (``run.lock``) while the cells run. The attack is passed in: this package never imports the attacks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from privfed.data.datasets import check_dataset_present
from privfed.durable import check_path, make_directory
from privfed.errors import PrivfedError
from privfed.evaluation.features import StepProgress
from privfed.run.directory import RunDirectory
from privfed.studies.cell_work import AttackRun, check_cells_plan, study_row
from privfed.studies.grid import Cell, Study
from privfed.studies.results import StudyResult, StudyStopped, write_results
from privfed.studies.runner import Progress, recorded_cells, run_study

#: Called with a cell's run name as it starts; the callback it returns hears that run's events (as ``privfed train``'s).
RunProgress = Callable[[str], Callable[[dict[str, Any]], None]]


def study_folder(study_file: str | os.PathLike[str], out: str | os.PathLike[str] | None) -> Path:
    """The study directory: ``out``, else ``studies/<the file's name>``."""
    return Path(out) if out is not None else Path("studies") / Path(study_file).stem


def check_study_data(study: Study) -> None:
    """Stops (PrivfedError) before the first cell when a cell's data is missing, instead of every cell failing alike."""
    for config in {cell.config for cell in study.cells()}:
        for dataset in filter(None, (config.dataset, config.test_dataset)):
            check_dataset_present(dataset, data_dir=Path(config.data_dir), download=config.download)


def run_study_file(
    study: Study,
    study_file: str | Path,
    folder: Path,
    *,
    attack: AttackRun | None = None,
    reuse_stale: bool = False,
    log: Progress | None = None,
    run_progress: RunProgress | None = None,
    progress: StepProgress | None = None,
) -> StudyResult:
    """Runs (or continues) ``study`` in ``folder`` and writes its tables and plots, titled by ``study_file``'s name.

    ``log`` hears the study's lines, ``run_progress`` each cell's run, ``progress`` its probes' stages (the attack
    has its own, bound in ``attack``). Raises as :func:`privfed.study` does.
    """
    check_study_data(study)
    check_path(folder, "the study directory")
    check_cells_plan(study, folder)  # a cell that cannot run stops the study before any trains
    make_directory(folder, kind="study directory")

    def work(cell: Cell, cell_folder: Path) -> dict[str, Any]:
        return study_row(
            cell, cell_folder, attack_method=study.attack, attack=attack, finetune=study.finetune,
            round_progress=None if run_progress is None else run_progress(cell.run_name), step_progress=progress,
        )

    with RunDirectory(folder).claimed():
        try:
            records = run_study(study, folder, work, progress=log, reuse_stale=reuse_stale)
        except KeyboardInterrupt as stop:
            result = write_results(study, folder, recorded_cells(study, folder), name=Path(study_file).stem)
            raise StudyStopped(str(stop), result) from None
        return write_results(study, folder, records, name=Path(study_file).stem)


def report_study_file(study: Study, study_file: str | Path, folder: Path) -> StudyResult:
    """Writes the tables and plots of the cells recorded in ``folder`` (PrivfedError when none), running nothing."""
    check_path(folder, "the study directory")
    records = recorded_cells(study, folder) if folder.is_dir() else []
    if not records:
        raise PrivfedError(f"{folder} holds no recorded run of {study_file}; run the study first")
    return write_results(study, folder, records, name=Path(study_file).stem)
