"""Everything a run decides before its first round, decided once (:func:`plan_run`).

``privfed train`` (to fail fast, before it starts a runtime) and the server
app both need the client sizes, the SecAgg+ parameters and the privacy plan;
the plan then travels to the server-side driver and the strategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privfed.config import TrainConfig, validate
from privfed.data.arrays import size_mismatch
from privfed.data.federated import FederatedSplit, cached_dataset
from privfed.errors import PrivfedError
from privfed.models.resnet import BACKBONES
from privfed.privacy.budget import PrivacyPlan, plan_privacy
from privfed.privacy.ledger import DP_SGD, same_events
from privfed.run.directory import RunDirectory, default_run_dir
from privfed.run.resume import (
    SERVER_LEDGER,
    UNKNOWN_SPENT,
    ResumePoint,
    check_resumable,
    entries_after_point,
    point_config,
    read_resume_point,
    resumed_config,
)
from privfed.secagg.settings import SecAggPlusSettings, secagg_settings


@dataclass(frozen=True)
class RunPlan:
    """A run's resolved configuration and what follows from it.

    ``config`` is as the run records it (``out`` resolved, ``delta`` the one in force); ``secagg`` None:
    ``--no-secagg``; ``warnings``: what the run can do but the user should know.
    """

    config: TrainConfig
    split: FederatedSplit
    client_sizes: tuple[int, ...]
    secagg: SecAggPlusSettings | None
    privacy: PrivacyPlan
    warnings: tuple[str, ...] = ()

    @property
    def run_dir(self) -> RunDirectory:
        assert self.config.out is not None  # plan_run always sets it
        return RunDirectory(Path(self.config.out))


def plan_run(config: TrainConfig, *, resuming: bool = False) -> RunPlan:
    """Plans a run; refuses (:class:`PrivfedError`) an occupied run directory (unless ``resuming`` it), or data or
    a budget the run cannot use."""
    if config.out is None:
        config = config.replace(out=str(default_run_dir(config)))
    assert config.out is not None
    if not resuming:
        RunDirectory(Path(config.out)).check_unused()
    if config.backbone not in BACKBONES:  # the network is first built on the server, after the runtime started
        raise PrivfedError(f"unknown backbone {config.backbone!r} (choose from {', '.join(BACKBONES)})")
    split = FederatedSplit.of(config)
    sizes = split.client_sizes()
    check_training_data(config, split, sizes)
    warnings = _test_data_warnings(config, split) + _one_class_warnings(config, split)
    secagg = secagg_settings(config, sizes)
    try:
        privacy = plan_privacy(config, sizes)
    except (OverflowError, MemoryError) as err:  # the accountant, at settings far from any useful guarantee
        raise PrivfedError(
            f"the privacy accountant cannot work with these settings ({type(err).__name__}); choose an epsilon, delta "
            "or noise multiplier nearer the usual ones"
        ) from None
    return RunPlan(config.replace(delta=privacy.delta), split, tuple(sizes), secagg, privacy, warnings)


#: The fewest images a client trains on: one batch of two (BatchNorm needs two; a lone image makes no step).
MIN_CLIENT_IMAGES = 2


def check_training_data(config: TrainConfig, split: FederatedSplit, sizes: list[int]) -> None:
    """Refuses (:class:`PrivfedError`) training data no client could learn from, before round 0: non-square
    images (the rotations and square crops need them), or no client with :data:`MIN_CLIENT_IMAGES` images."""
    height, width = split.train_data().images.shape[1:3]
    if height != width:
        raise PrivfedError(
            f"{config.dataset}: training images must be square (rotations and crops assume it), got {height}×{width}"
        )
    if max(sizes) < MIN_CLIENT_IMAGES:
        raise PrivfedError(
            f"{config.dataset} across {config.num_clients} clients leaves each with at most {max(sizes)} image, and a "
            f"client needs {MIN_CLIENT_IMAGES} to train (a batch of two, for BatchNorm): use fewer clients or more data"
        )


def _one_class_warnings(config: TrainConfig, split: FederatedSplit) -> tuple[str, ...]:
    """Says that the kNN monitor's accuracy means nothing when every training image (its reference set) has one label."""
    labels = split.train_data().labels
    if labels.min() != labels.max():
        return ()
    return (f"every training image of {config.dataset} has label {int(labels[0])}, so the kNN monitor predicts it "
            "for every test image: its accuracy says nothing about the encoder",)


def _test_data_warnings(config: TrainConfig, split: FederatedSplit) -> tuple[str, ...]:
    """Loads a separate ``--test-dataset`` now (refusing one that cannot be loaded: the kNN monitor needs it once
    the runtime runs) and compares image sizes."""
    if config.test_dataset is None:
        return ()
    test = cached_dataset(config.test_dataset, "test", config.data_dir, config.download)
    mismatch = size_mismatch(split.train_data(), test, train_name=f"training ({config.dataset})",
                             test_name=f"test ({config.test_dataset})")
    return () if mismatch is None else (f"{mismatch}; the kNN monitor compares them anyway",)


def plan_resume(run_dir: Path, overrides: dict[str, Any]) -> tuple[RunPlan, ResumePoint]:
    """Plans the rest of a stopped run from its resume point, under the rules of docs/flower.md, "Resuming a run"
    (:class:`PrivfedError` says why it cannot be resumed so)."""
    directory = RunDirectory(run_dir)
    point = read_resume_point(directory)
    # The directory named, wherever it was first written from: a relative recorded `out` would point elsewhere.
    here = str(directory.path.resolve())
    try:  # a damaged config.json can hold values no run was started with
        validate(directory.config().replace(out=here))
    except PrivfedError as err:
        raise PrivfedError(f"{directory.path / 'config.json'}: {err}") from None
    recorded = point_config(directory, point)  # what the point was written under: config.json may differ only so far
    config = resumed_config(directory, point, overrides)
    validate(config)  # with the rounds asked for now
    check_resumable(directory, point, config)
    plan = plan_run(config, resuming=True)
    _check_charges_after_point(directory, point, plan)
    if config != recorded:
        before = plan_privacy(recorded, list(plan.client_sizes))
        after = plan.privacy
        before_sgd = None if before.dp_sgd is None else before.dp_sgd.settings
        after_sgd = None if after.dp_sgd is None else after.dp_sgd.settings
        if before.params != after.params or before_sgd != after_sgd:
            raise PrivfedError(
                f"{config.rounds} rounds would change the privacy calibration of a run planned for "
                f"{recorded.rounds}; a budget spread over the planned rounds cannot stretch"
            )
    if point.mechanism_params is not None and point.mechanism_params != plan.privacy.params:
        raise PrivfedError(
            f"{config.mechanism} now plans this run with {plan.privacy.params}, not the {point.mechanism_params} of its "
            "resume point (the installed mechanism changed, or a setting's default moved): it cannot go on as planned"
        )
    return plan, point


def _check_charges_after_point(directory: RunDirectory, point: ResumePoint, plan: RunPlan) -> None:
    """Refuses (:class:`PrivfedError`) a charge after the point in the server's ledger that this run would not make.

    Replaying its round, the ledger would refuse the run's own charge mid-run,
    or a line added by hand would stand in for it.
    """
    from mechanisms import get_mechanism_class

    mechanism = plan.config.release_mechanism
    releases = None if mechanism is None else (get_mechanism_class(mechanism).name,)
    dp_sgd = plan.privacy.dp_sgd
    path = directory.path / SERVER_LEDGER
    for entry in entries_after_point(directory, point).get(path, []):
        if entry.kind == DP_SGD:
            sizes = plan.client_sizes
            planned = None if dp_sgd is None or not 0 <= entry.client < len(sizes) else dp_sgd.round_events(sizes[entry.client])
            fits = planned is not None and entry.mechanism == DP_SGD and same_events(entry.events, planned)
        else:
            fits = releases is not None and (entry.mechanism,) == releases
            fits = fits and same_events(entry.events, plan.privacy.per_release_events)
        if not fits:
            raise PrivfedError(
                f"{path} charges client {entry.client} in round {entry.round} with {entry.mechanism} events this run "
                f"does not make: {UNKNOWN_SPENT}"
            )
