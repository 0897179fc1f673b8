"""privfed's Python API: the code paths of ``privfed train``, ``evaluate``, ``attack``, ``study`` and ``tune``.

Unlike a command, a call leaves its process's Flower log level, warning filters and signal handlers as it found
them. Bad input raises :class:`PrivfedError` with the one-line message the CLI prints.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from privfed.config import (
    DEFAULTS,
    TrainConfig,
    build_config,
    checked_options,
    validate,
)
from privfed.durable import check_path, make_directory
from privfed.errors import PrivfedError

if TYPE_CHECKING:
    import torch

    from privfed.evaluation.features import StepProgress
    from privfed.run.plan import RunPlan
    from privfed.run.resume import ResumePoint
    from privfed.studies.cell_work import AttackRun
    from privfed.studies.orchestration import RunProgress
    from privfed.studies.results import StudyResult, TuneResult

#: A run, as the functions below accept it: a :class:`Run` or its directory.
RunLike = Union["Run", str, "os.PathLike[str]"]
#: Called with each event of a training run ("start", "round", "stop", "finish"), as ``privfed train`` prints them.
TrainProgress = Callable[[dict[str, Any]], None]
#: Called as an attack trains: ``(stage, steps done, steps in all, figures so far)``.
AttackProgress = Callable[[str, int, int, dict[str, float]], None]


@dataclass(frozen=True)
class Run:
    """A run directory (:mod:`privfed.run.directory`) and its ``summary.json``."""

    path: Path
    summary: dict[str, Any]

    @property
    def stop_cause(self) -> str | None:
        """Why the run ended early, as a program reads it (:mod:`privfed.run.stop`'s causes), or None."""
        from privfed.run.stop import stop_cause

        return stop_cause(self.summary)

    @classmethod
    def open(cls, run_dir: str | os.PathLike[str]) -> Run:
        """A run trained earlier; PrivfedError when ``run_dir`` holds no finished or stopped run."""
        from privfed.run.directory import RunDirectory

        directory = RunDirectory(Path(run_dir))
        directory.config()  # says when it is no run directory at all
        if not (directory.path / "summary.json").is_file():
            raise PrivfedError(f"{directory.path} holds no summary.json: the run has not ended")
        return cls(directory.path, directory.read_json("summary.json"))

    @property
    def config(self) -> TrainConfig:
        """The configuration the run recorded."""
        from privfed.run.directory import RunDirectory

        return RunDirectory(self.path).config()

    def load_encoder(self, *, checkpoint: str = "final") -> torch.nn.Module:
        """The trained encoder; see :func:`load_encoder`."""
        return load_encoder(self, checkpoint=checkpoint)


def train(
    config: TrainConfig | str | os.PathLike[str] | None = None,
    *,
    out: str | os.PathLike[str] | None = None,
    progress: TrainProgress | None = None,
    verbose: bool = False,
    **options: Any,
) -> Run:
    """Trains a run on simulated federated clients, as ``privfed train`` does.

    Args:
        config: A :class:`TrainConfig`, a TOML preset's path, or None for the defaults.
        out: The run directory (it must hold no run); default ``config.out``, else ``runs/<time>-<method>-...``.
        progress: Hears each round's event; nothing is printed.
        verbose: Let Flower's and Ray's own logs through.
        **options: :class:`TrainConfig` fields over ``config``.

    Returns:
        The run; ``run.stop_cause`` says why it stopped early (the budget, no client could train), if it did.

    Raises:
        PrivfedError: an unknown option or bad value, missing data, an occupied run directory, a missing device.
    """
    from privfed.federation.local_runtime import own_process_state
    from privfed.federation.simulation import simulate

    resolved = _resolve_config(config, options)
    if out is not None:
        resolved = resolved.replace(out=os.fspath(out))
    with own_process_state(), claimed_run(resolved) as (plan, _):  # a run seeds torch's and numpy's generators
        summary = simulate(plan, progress, verbose=verbose)
    return Run(plan.run_dir.path, summary)


def _resolve_config(config: TrainConfig | str | os.PathLike[str] | None, options: Mapping[str, Any]) -> TrainConfig:
    """``config`` with ``options`` over it, each value checked as a preset's would be (else PrivfedError)."""
    if config is None or isinstance(config, (str, os.PathLike)):
        return build_config(None if config is None else Path(config), **checked_options(dict(options), source="train()"))
    if not isinstance(config, TrainConfig):
        raise PrivfedError(f"config must be a TrainConfig or a preset's path, got {type(config).__name__}")
    values = {**config.to_dict(), **options}
    resolved = TrainConfig(**checked_options(values, source="the configuration"))
    validate(resolved)
    return resolved


@contextmanager
def claimed_run(
    config: TrainConfig | None = None, *, resume: Path | None = None, overrides: Mapping[str, Any] | None = None
) -> Iterator[tuple[RunPlan, ResumePoint | None]]:
    """Plans a run (or, with ``resume``, the rest of a stopped one) and holds its directory while the block trains it.

    Everything that can fail before training (the plan, the machine, the directory) raises PrivfedError here.
    """
    from privfed.run.directory import RunDirectory
    from privfed.run.plan import plan_resume, plan_run
    from privfed.run.resume import has_resume_point

    with ExitStack() as held:  # the run directory stays claimed until training ends
        if resume is None:
            if config is None:
                raise PrivfedError("a new run needs a configuration")
            if config.out is not None:
                check_path(Path(config.out), "the run directory (--out)")
            plan, point = plan_run(config), None
            check_machine(plan.config)
            make_directory(plan.run_dir.path, kind="run directory")
            held.enter_context(plan.run_dir.claimed())
        else:
            check_path(resume, "the run directory (--resume)")
            if not RunDirectory(resume).holds_a_run() and not has_resume_point(RunDirectory(resume)):
                raise PrivfedError(f"{resume} holds no privfed run; nothing to resume")  # refused before its lock is made
            held.enter_context(RunDirectory(resume).claimed())  # before the resume rewrites anything
            plan, point = plan_resume(resume, dict(overrides or {}))
            check_machine(plan.config)
        yield plan, point


def check_machine(config: TrainConfig) -> None:
    """Refuses a device or client resources this machine lacks before the runtime starts (Ray would wait for them
    forever, and the server first resolves its device after the runtime started)."""
    import torch

    from privfed.device import resolve_device

    resolve_device(config.device)
    if config.runtime == "ray":
        from privfed.federation.simulation import require_ray

        require_ray()
    cores = os.cpu_count() or 1
    if config.client_cpus > cores:
        raise PrivfedError(f"--client-cpus {config.client_cpus:g} is more than this machine's {cores} CPU cores")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if config.client_gpus > gpus:
        raise PrivfedError(
            f"--client-gpus {config.client_gpus:g} asks for more GPUs than this machine has ({gpus}); "
            "use --client-gpus 0 on a machine without one"
        )


def _run_path(run: RunLike) -> Path:
    if isinstance(run, Run):
        return run.path
    if not isinstance(run, (str, os.PathLike)):
        raise PrivfedError(f"expected a Run or a run directory, got {type(run).__name__}")
    path = Path(run)
    check_path(path, "the run directory")
    if not path.is_dir():
        raise PrivfedError(f"run directory not found: {path}")
    return path


def load_encoder(run: RunLike, *, checkpoint: str = "final") -> torch.nn.Module:
    """A run's trained encoder (the backbone the probes score), on the CPU, in eval mode.

    ``checkpoint``: ``final``, ``initial`` or a checkpoint file's path.

    Raises:
        PrivfedError: no run there, or the checkpoint is missing or damaged.
    """
    from privfed.run.directory import RunDirectory, load_network

    directory = RunDirectory(_run_path(run))
    network = load_network(directory.config(), directory.checkpoint_path(checkpoint))
    return network.online.backbone.eval()


def evaluate(
    run: RunLike,
    *,
    protocol: str = "knn",
    train_data: str | None = None,
    test_data: str | None = None,
    checkpoint: str = "final",
    label_fraction: float = 0.1,
    seed: int = 0,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    device: str = DEFAULTS.device,
    knn_k: int = DEFAULTS.knn_k,
    knn_temperature: float = DEFAULTS.knn_temperature,
    progress: StepProgress | None = None,
) -> dict[str, Any]:
    """Scores a run's encoder, as ``privfed evaluate`` does (its ``--help`` tells the options), and appends the
    result to ``evaluation.json``. ``train_data``, ``test_data`` and ``data_dir`` default to the run's; ``progress``
    hears each probe epoch (nothing is printed).

    Returns:
        The result as ``evaluation.json`` records it; ``accuracy`` is None for ``tsne``.

    Raises:
        PrivfedError: an unknown protocol, a bad value, missing data or run.
    """
    from privfed.run.directory import RunDirectory
    from privfed.run.evaluation import PROBES, evaluate_run

    path = _run_path(run)
    recorded = RunDirectory(path).config()
    own_test = recorded.test_dataset or recorded.dataset
    return evaluate_run(
        path,
        train_data=train_data if train_data is not None or protocol not in PROBES else recorded.dataset,
        test_data=test_data if test_data is not None else own_test,
        protocol=protocol,
        label_fraction=label_fraction,
        seed=seed,
        checkpoint=checkpoint,
        data_dir=Path(data_dir if data_dir is not None else recorded.data_dir),
        download=download,
        device=device,
        knn_k=knn_k,
        knn_temperature=knn_temperature,
        progress=progress,
    )


def attack(
    run: RunLike,
    *,
    method: str = "decoder",
    rounds: Sequence[int] | None = None,
    aux: str | None = None,
    steps: int | None = None,
    settings: Mapping[str, Any] | None = None,
    max_vectors: int = 200,
    seed: int = 0,
    device: str = DEFAULTS.device,
    client_models: bool = False,
    progress: AttackProgress | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Inverts a run's recorded releases as a semi-honest server would, as ``privfed attack`` does.

    The run must have been trained with ``record_releases=True``; writes ``attack.json`` and ``attack.png`` into it.
    Options as ``privfed attack --help`` tells them; ``settings`` are further keyword arguments of the attack's class
    (``steps`` wins over one there), ``progress`` hears its training (nothing is printed); ``client_models`` inverts
    with each client's model after local training where a ``--no-secagg`` run recorded its update.

    Returns:
        ``attack.json``'s content: per round, the reconstructions' scores beside the null's.

    Raises:
        PrivfedError: an unknown attack or setting, a run without recorded releases, a round not recorded,
            overlapping auxiliary data, or too little memory.
    """
    import torch

    from attacks.evaluation import attack_run
    from privfed.config import check_seed

    check_seed("seed", seed)
    if max_vectors < 1:
        raise PrivfedError(f"max_vectors must be at least 1, got {max_vectors}")
    if steps is not None and steps < 1:
        raise PrivfedError(f"steps must be at least 1, got {steps}")
    attack_settings = {**(settings or {}), **({} if steps is None else {"steps": steps})}
    check_attack_settings(method, attack_settings, where=f"attack {method}")
    path = _run_path(run)
    try:
        return attack_run(
            path, method=method, aux=aux, rounds=None if rounds is None else sorted(set(rounds)), device=device,
            seed=seed, max_vectors=max_vectors, attack_settings=attack_settings or None, client_models=client_models,
            progress=progress, log=log,
        )
    except (MemoryError, torch.OutOfMemoryError):
        raise PrivfedError("out of memory: attack fewer vectors (max_vectors, --max-vectors) or use a larger device") from None


def check_attack_settings(method: str, settings: Mapping[str, Any], *, where: str) -> None:
    """Builds the attack once, so an unknown attack or setting fails before any data loads (PrivfedError after ``where``)."""
    from attacks import get_attack_class

    try:
        get_attack_class(method)(seed=0, **settings)
    except (TypeError, ValueError) as err:
        raise PrivfedError(f"{where}: {err}") from None


def study(
    study_file: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str] | None = None,
    report: bool = False,
    reuse_stale: bool = False,
    dataset: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool | None = None,
    log: Callable[[str], None] | None = None,
    run_progress: RunProgress | None = None,
    progress: StepProgress | None = None,
) -> StudyResult:
    """Runs every cell of a study not yet finished (train, evaluate, attack), as ``privfed study`` does.

    Writes ``results.csv``, ``results.md`` and the plots into the study directory (docs/studies.md); a cell that
    fails is recorded as failed and the study goes on. Options as ``privfed study --help`` tells them (a
    ``dataset``, ``data_dir`` or ``download`` of None: the study's own). ``log`` hears a line as the study starts,
    keeps or fails a cell; ``run_progress`` is called with each cell's run name, and the callback it returns hears
    that run's events; ``progress`` hears the probes' and the attack's stages.

    Raises:
        PrivfedError: a bad study file or attack setting, a cell that cannot run, missing data, stale cells, no
            recorded cell (``report``).
        StudyStopped: Ctrl-C stopped it; its ``result`` has the tables of the cells recorded so far.
    """
    from privfed.federation.local_runtime import own_process_state
    from privfed.studies.grid import Study
    from privfed.studies.orchestration import report_study_file, run_study_file, study_folder

    path = Path(study_file)
    overrides = {"dataset": dataset, "data_dir": None if data_dir is None else os.fspath(data_dir), "download": download}
    spec = Study.load(path, overrides=overrides)
    folder = study_folder(path, out)
    if report:
        return report_study_file(spec, path, folder)
    attack: AttackRun | None = None
    if spec.attack is not None:  # its settings checked first: an unknown one fails before anything trains
        from attacks.evaluation import attack_last_round

        where = f"study file {path}: [attack_settings] for {spec.attack}"
        check_attack_settings(spec.attack, spec.attack_settings, where=where)
        attack = functools.partial(attack_last_round, attack_settings=spec.attack_settings or None, progress=progress)
    with own_process_state():  # each cell's run seeds torch's and numpy's generators
        return run_study_file(
            spec, path, folder, attack=attack, reuse_stale=reuse_stale, log=log, run_progress=run_progress,
            progress=progress,
        )


def tune(
    study_file: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str] | None = None,
    reuse_stale: bool = False,
    dataset: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool | None = None,
    log: Callable[[str], None] | None = None,
    run_progress: RunProgress | None = None,
    progress: StepProgress | None = None,
) -> TuneResult:
    """Runs a study as :func:`study` does and ranks its settings without labels by Align + 0.2 Unif (paper §5).

    The linear-probe accuracy stands beside each score, to check the choice; the ranking is written to
    ``tuning.md`` in the study directory. Arguments, and what is raised, as for :func:`study`.
    """
    from privfed.studies.results import write_tuning

    result = study(
        study_file, out=out, reuse_stale=reuse_stale, dataset=dataset, data_dir=data_dir, download=download, log=log,
        run_progress=run_progress, progress=progress,
    )
    return write_tuning(result, name=Path(study_file).stem)

