"""A study's results: the files written from its cells' records (all, or those so far: then marked partial), and
what a run of the study gives back. No torch here (the plots load it), so the command line imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from privfed.studies.grid import Study
from privfed.studies.runner import CellRecord
from privfed.studies.tables import tuning_ranking, write_csv, write_markdown

TUNING_FILE = "tuning.md"


@dataclass(frozen=True)
class StudyResult:
    """A study's directory, the records of its cells that have one (in order), how many ``cells`` it has, and the
    files ``written`` (``results.csv``, ``results.md``, the plots; none without a record)."""

    folder: Path
    records: tuple[CellRecord, ...]
    cells: int
    written: tuple[Path, ...]

    @property
    def failed(self) -> int:
        """The recorded cells that ended in an error."""
        return sum(not record.finished for record in self.records)


class StudyStopped(KeyboardInterrupt):
    """Ctrl-C stopped the study once the tables and plots so far were written (``result``); the same call goes on."""

    def __init__(self, reason: str, result: StudyResult) -> None:
        super().__init__(reason)
        self.result = result


@dataclass(frozen=True)
class TuneResult:
    """A tuning study's own result, its ranking by tuning score (Markdown), and ``tuning.md``'s path."""

    study: StudyResult
    ranking: str
    path: Path


def write_results(study: Study, folder: Path, records: list[CellRecord], *, name: str) -> StudyResult:
    """Writes the tables and plots of ``records`` into ``folder`` (nothing when there are none); ``name`` titles them."""
    from privfed.studies.plots import write_study_plots  # matplotlib and torch: only once there is something to draw

    cells = len(study.cells())
    if not records:
        return StudyResult(folder, (), cells, ())
    write_csv(records, folder / "results.csv")
    write_markdown(records, folder / "results.md", title=f"Study {name}", cells=cells)
    pictures = write_study_plots(records, folder)
    return StudyResult(folder, tuple(records), cells, (folder / "results.csv", folder / "results.md", *pictures))


def write_tuning(result: StudyResult, *, name: str) -> TuneResult:
    """Ranks the study's settings by the label-free tuning score and writes ``tuning.md`` beside its tables."""
    ranking = tuning_ranking(list(result.records))
    path = result.folder / TUNING_FILE
    path.write_text(
        f"# Tuning {name}\n\nHigher score first; the accuracy is for comparison only (it needs labels).\n\n{ranking}"
    )
    return TuneResult(result, ranking, path)
