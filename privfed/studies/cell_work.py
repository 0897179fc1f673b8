"""One study cell's work: train the run (or finish a stopped one), evaluate it, attack it, and return its row.

The attack is passed in (:data:`AttackRun`), so the studies package never imports the attacks.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from privfed.errors import PrivfedError
from privfed.studies.grid import Cell, Study

#: ``attack(run_dir, method=...)``: attacks a recorded run's last round and returns that round's figures
#: (``privfed study`` passes :func:`attacks.evaluation.attack_last_round`).
AttackRun = Callable[..., dict[str, Any]]

#: The study's attack columns, each from the first ``attack.json`` name present: how many dB closer than the null a
#: reconstruction comes to the image behind its vector (a centroid's best-matching member, a ``reps`` vector's
#: source; unknown where the scorer cannot replay the members, so for DP releases), and to the closest of the
#: client's images (every vector); and how many vectors each averages.
ATTACK_COLUMNS: dict[str, tuple[str, ...]] = {
    "attack_advantage_psnr": ("advantage_psnr_best_member", "advantage_psnr_source"),
    "attack_advantage_psnr_client": ("advantage_psnr_best_client",),
    "attack_vectors": ("vectors",),
    "attack_member_vectors": ("n_psnr_best_member", "n_psnr_source"),
}


def attack_figures(round_result: dict[str, Any]) -> dict[str, float | None]:
    """The study's attack columns from one round of ``attack.json`` (None where its vectors lack the truth)."""
    figures = {
        column: next((round_result[name] for name in names if name in round_result), None)
        for column, names in ATTACK_COLUMNS.items()
    }
    if figures["attack_member_vectors"] is None and figures["attack_vectors"] is not None:
        figures["attack_member_vectors"] = 0
    return figures


class StudyInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a cell's run: the study stops too (the cell is not finished; a rerun resumes it)."""


def train_cell(
    cell: Cell, run_dir: Path, *, record_releases: bool, progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """The summary of the cell's run: read when it finished, resumed when it stopped, trained otherwise.

    A run that cannot be resumed, or whose resumed round went otherwise than the run left alone
    (:func:`replayed_exactly`), is trained again from nothing.
    """
    from privfed.federation.simulation import simulate
    from privfed.run.directory import RunDirectory
    from privfed.run.plan import plan_resume, plan_run
    from privfed.run.resume import has_resume_point
    from privfed.run.stop import INTERRUPTED, run_failed, stop_cause

    summary_file = run_dir / "summary.json"
    if summary_file.is_file():
        summary = RunDirectory(run_dir).read_json("summary.json")
        if stop_cause(summary) != INTERRUPTED and not run_failed(summary):
            return summary  # a run that stopped because it could not train is tried again from its resume point
    if has_resume_point(RunDirectory(run_dir)):
        killed = not summary_file.is_file()
        try:
            plan, point = plan_resume(run_dir, {})
            summary = simulate(plan, progress, resume=point)
            if not killed or replayed_exactly(RunDirectory(run_dir), point.round + 1):
                return summary
        except PrivfedError:
            pass  # not resumable: start again
    if run_dir.exists():
        shutil.rmtree(run_dir)
    config = cell.config.replace(out=str(run_dir), record_releases=record_releases or cell.config.record_releases)
    return simulate(plan_run(config), progress)


def check_cells_plan(study: Study, out: Path) -> None:
    """Plans every unfinished cell, as its run will, so one that cannot run stops the study before any trains.

    Planning checks what needs the data and the budget too (an ``ldp`` cell without epsilon, a client with too few
    images). PrivfedError names the study file, the cell and why.
    """
    from privfed.run.plan import plan_run
    from privfed.studies.runner import cell_folder, read_record

    for cell in study.cells():
        folder = cell_folder(out, cell)
        record = read_record(folder)
        if record is not None and record.finished:
            continue
        try:  # resuming=True: a stopped run in the folder is the cell's own, continued later
            plan_run(cell.config.replace(out=str(folder / "run")), resuming=True)
        except PrivfedError as err:
            raise PrivfedError(f"study file {study.path}, cell {cell.run_name}: {err}") from None


def replayed_exactly(run: Any, round_index: int) -> bool:
    """Whether ``round_index``, the round a kill interrupted, went as in the run left alone: every sampled client
    answered it, none charged as one that may have released before the kill."""
    from privfed.run.driver import IN_PROGRESS_STATEMENT

    line = next((m for m in run.metrics() if m["round"] == round_index), None)
    if line is None:
        return True  # the resumed run stopped before it: nothing went otherwise
    if line["clients_completed"] != line["clients_sampled"]:
        return False
    ledger = run.path / "ledger.jsonl"
    entries = [json.loads(text) for text in ledger.read_text().splitlines()] if ledger.is_file() else []
    return not any(entry["guarantee"].get("statement") == IN_PROGRESS_STATEMENT for entry in entries)


def finetune_column(fraction: float) -> str:
    """``finetune_0.01``: the row's column for fine-tuning on that fraction of the labels."""
    return f"finetune_{fraction:g}"


def study_row(
    cell: Cell,
    folder: Path,
    *,
    attack_method: str | None,
    attack: AttackRun | None,
    finetune: tuple[float, ...] = (),
    round_progress: Callable[[dict[str, Any]], None] | None = None,
    step_progress: Callable[[str, int, int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Trains (or finishes) the cell's run in ``folder/run``, scores it and attacks it.

    Scores, of the trained and the untrained encoder: kNN, the linear probe, and for each fraction in ``finetune``
    fine-tuning on that class-balanced share of the labels (seeded by the cell's seed); and the label-free tuning
    score. ``round_progress`` hears the run's events, ``step_progress`` the probes' epochs.
    """
    from privfed.run.evaluation import evaluate_run, score_run
    from privfed.run.stop import INTERRUPTED, run_failed, stop_cause

    run_dir = folder / "run"
    attacked = attack_method is not None and attack is not None and cell.config.release_mechanism is not None
    summary = train_cell(cell, run_dir, record_releases=attacked, progress=round_progress)
    if stop_cause(summary) == INTERRUPTED:
        raise StudyInterrupted(f"{cell.run_name}: {summary['stopped_early']}")
    if run_failed(summary):  # recorded as the cell's error, never as a result
        raise RuntimeError(f"the run stopped: {summary['stopped_early']}")
    config = cell.config
    evaluate = functools.partial(
        evaluate_run, run_dir, train_data=config.dataset, test_data=config.test_dataset or config.dataset,
        data_dir=Path(config.data_dir), device=config.device, progress=step_progress,
    )
    # The untrained encoder's scores too: on small images random features alone reach much of the trained one's.
    linear, linear_init = (evaluate(protocol="linear", checkpoint=checkpoint) for checkpoint in ("final", "initial"))
    finetuned = {
        finetune_column(fraction) + suffix: evaluate(
            protocol="finetune", label_fraction=fraction, seed=cell.seed, checkpoint=checkpoint
        )["accuracy"]
        for fraction in finetune
        for checkpoint, suffix in (("final", ""), ("initial", "_init"))
    }
    unsupervised = score_run(run_dir, device=config.device)
    privacy = summary["privacy"]
    row: dict[str, Any] = {
        "method": config.method,
        "mechanism": config.release_mechanism,
        "epsilon_budget": config.epsilon if config.release_mechanism is not None else None,
        "epsilon_per_release": privacy.get("epsilon_per_release"),
        "knn": summary["knn_accuracy"],
        "knn_init": summary["knn_accuracy_init"],
        "linear": linear["accuracy"],
        "linear_init": linear_init["accuracy"],
        **finetuned,
        "alignment": unsupervised["alignment"],
        "uniformity": unsupervised["uniformity"],
        "tuning_score": unsupervised["tuning_score"],
        "rounds": summary["rounds"],
        "epsilon": privacy.get("epsilon"),
        "delta": privacy.get("delta"),
        "k": privacy.get("k"),
        "statement": privacy.get("headline"),  # the long text stays in the run's summary.json
        "covers": privacy.get("covers"),
        "not_covered": privacy.get("not_covered"),
        "privacy_details": privacy.get("details"),
        "stopped_early": summary.get("stopped_early"),
        "wall_seconds": summary["wall_seconds"],
    }
    if attacked:
        assert attack is not None and attack_method is not None
        last = attack(run_dir, method=attack_method)
        row.update(attack_figures(last))
        row["attack_round"] = last["round"]
    return row
