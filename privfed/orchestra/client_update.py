"""One client's whole contribution to a round, independent of any FL runtime.

:func:`run_client_round` trains (round 0 only computes representations) and
asks the mechanism what may leave the client; it returns exactly what may be
sent (:class:`ClientUpdate`) and drops the memory. A method that does not
cluster (:mod:`privfed.methods`) has no mechanism and releases nothing.
:func:`train_locally` is the one loop every method and DP-SGD run through;
under DP-SGD the metrics hold nothing computed from the data.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import torch

from mechanisms.base import (
    Mechanism,
    PrivacyEvent,
    Release,
    ReleaseMechanism,
    SecureSumMechanism,
    checked_release,
    round_releases,
)
from privfed.methods import Batch, get_method
from privfed.models.network import OrchestraNetwork, ema_update
from privfed.orchestra.cohort_training import TrainedMember
from privfed.orchestra.local_training import (
    LocalTrainingConfig,
    LocalTrainingResult,
    augmentation_generator,
    normalised_centroids,
    sgd_parts,
    step_means,
)
from privfed.orchestra.memory import RepresentationMemory, first_kept_batch
from privfed.orchestra.memory_sampling import every_representation, initial_representations, poisson_memory
from privfed.orchestra.model_state import StateDict, load_shared_state, shared_state, state_delta

#: Metrics a DP-SGD client may send: counts fixed by its (public) size, and timings.
DP_SGD_METRICS = ("train_seconds", "steps", "release_seconds")


@dataclass(frozen=True)
class ClientUpdate:
    """What a client sends back; nothing else about its data leaves it.

    Attributes:
        release: What the mechanism made of the memory (None: the method releases nothing, or shares).
        share: A secure-sum mechanism's share (None otherwise, and in round 0): it may leave the client
            only inside SecAgg+'s masked vector.
        num_samples: The client's dataset size (public: the FedAvg weight).
        metrics: Diagnostics; under DP-SGD only :data:`DP_SGD_METRICS`. Sent only in a run that
            reports them (:func:`privfed.federation.client.reported_metrics`).
        privacy_events: The DP-SGD cost of this round's update (empty without DP-SGD, and in round 0).
    """

    delta: StateDict | None
    release: Release | None
    num_samples: int
    metrics: dict[str, float] = field(default_factory=dict)
    privacy_events: tuple[PrivacyEvent, ...] = ()
    share: np.ndarray | None = None


@dataclass(frozen=True)
class PrivateRoundState:
    """What a client's round computed and never sends, for replays that score attacks (:mod:`attacks.scoring`).

    ``memory`` (``[m, D]``; None when nothing was released), each row's client example, and the round
    generator's state just before the release, from which the mechanism's non-private choices can be made
    again (:meth:`~mechanisms.base.ReleaseMechanism.release_with_members`).
    """

    memory: torch.Tensor | None
    memory_examples: torch.Tensor | None
    release_generator_state: torch.Tensor | None


def run_client_round(
    network: OrchestraNetwork,
    global_state: StateDict,
    centroids: torch.Tensor | None,
    images: torch.Tensor,
    *,
    train: bool,
    config: LocalTrainingConfig,
    mechanism: Mechanism | None,
    num_local_centroids: int,
    seed: int,
    device: torch.device,
    labels: torch.Tensor | None = None,
    trained: TrainedMember | None = None,
) -> tuple[ClientUpdate, PrivateRoundState]:
    """Runs a client's round: initialise (round 0) or train; returns the reply and what stays on the client.

    Args:
        centroids: ``[G, D]`` global centroids (None in round 0, and for a method without centroids).
        images: ``[n, 3, H, W]`` uint8 images of this client.
        mechanism: Decides what the memory turns into before it is sent (None: nothing is released: the method
            releases nothing, or the run's cadence skips the round).
        seed: Seeds shuffling, augmentation and the mechanism's choices.
        labels: ``[n]`` labels of ``images``: supervised FedAvg only (the other methods never see a label).
        trained: This client's training, done already in a cohort with the same model, centroids, images
            and seed (:func:`~privfed.orchestra.cohort_training.train_cohort`), in place of :func:`train_locally`.
    """
    generator = torch.Generator().manual_seed(seed)
    load_shared_state(network, global_state)
    events: tuple[PrivacyEvent, ...] = ()
    releases = round_releases(mechanism, round_index=int(train))  # round 0, or a training round that releases
    samples_every_image = releases and mechanism is not None and mechanism.input_sampling_rate < 1
    if not train:
        memory = examples = None
        if releases and not samples_every_image:
            # Under DP-SGD the memory is a Poisson sample from the start, as after training.
            initial_memory = poisson_memory if config.dp_sgd is not None else initial_representations
            memory, examples = initial_memory(network, images, config, generator=generator, device=device)
        delta = None
        metrics: dict[str, float] = {}
    else:
        result = train_locally(
            network, images, centroids, config, generator=generator, device=device, labels=labels
        ) if trained is None else adopt(network, trained, generator)
        memory, examples = result.memory, result.memory_examples
        delta = state_delta(shared_state(network), global_state)
        events = result.privacy_events
        metrics = {**result.step_means, "train_seconds": result.seconds, "steps": float(result.num_steps)}
    if samples_every_image:
        # The mechanism draws its secret sample from every image (after the delta: BatchNorm statistics move here).
        memory, examples = every_representation(network, images, config, generator=generator, device=device)
    release = release_state = share = None
    if releases and mechanism is not None:  # releases implies a mechanism; the test narrows its type
        assert memory is not None  # every releasing path above filled it
        start = time.perf_counter()
        release_state = generator.get_state()
        if isinstance(mechanism, SecureSumMechanism):
            share = mechanism.share(memory, num_centroids=num_local_centroids, generator=generator)
        elif isinstance(mechanism, ReleaseMechanism):
            release = checked_release(mechanism, memory, num_centroids=num_local_centroids, generator=generator)
        metrics["release_seconds"] = time.perf_counter() - start
    if config.dp_sgd is not None:
        metrics = {k: v for k, v in metrics.items() if k in DP_SGD_METRICS}
    size = int(images.shape[0])
    update = ClientUpdate(delta, release, num_samples=size, metrics=metrics, privacy_events=events, share=share)
    if release is None:
        memory = examples = None
    return update, PrivateRoundState(memory, examples, release_state)


def adopt(network: OrchestraNetwork, trained: TrainedMember, generator: torch.Generator) -> LocalTrainingResult:
    """Leaves ``network`` and ``generator`` as :func:`train_locally` would have, from a cohort's training of this client."""
    network.load_state_dict(trained.state)
    generator.set_state(trained.generator_state)
    return trained.result


def train_locally(
    network: OrchestraNetwork,
    images: torch.Tensor,
    centroids: torch.Tensor | None,
    config: LocalTrainingConfig,
    *,
    generator: torch.Generator,
    device: torch.device,
    labels: torch.Tensor | None = None,
) -> LocalTrainingResult:
    """One client's round of its method: ``config.epochs`` epochs, or DP-SGD's steps when ``config.dp_sgd`` is set.

    ``network`` is trained in place against the fixed global ``centroids``;
    ``generator`` shuffles and seeds the augmentations (under DP-SGD batch
    sampling and noise come from the OS's randomness). The target encoder,
    if any, follows by EMA after every step. The memory holds the target
    representations of the last batches, the latest view of each image;
    under DP-SGD it is a Poisson sample, and the result carries the round's DP-SGD cost.
    """
    start = time.perf_counter()
    method = get_method(config.method)
    n = int(images.shape[0])
    network.to(device).train()
    centroids = normalised_centroids(centroids, device)
    aug_generator = augmentation_generator(generator, device)
    dp = None if config.dp_sgd is None else _dp_sgd_training()
    parts = sgd_parts(network, n, config, generator=generator) if dp is None else dp.dp_sgd_parts(
        network, n, config, method, device=device
    )
    # Under DP-SGD the memory is a Poisson sample drawn after training, not the last batches.
    memory = RepresentationMemory(config.memory_size, network.projection_dim) if dp is None else None
    totals: dict[str, torch.Tensor] = {}
    steps = stepped_batches = 0
    with parts as (batches, step):
        images = images.to(device)
        labels = None if labels is None else labels.to(device)
        schedule, kept_from = _on_device(batches, device, memory)
        for position, (index, on_device) in enumerate(schedule):
            out = None
            if index.numel():
                batch_labels = None if labels is None else labels[on_device]
                out = method.step(network, Batch(images[on_device], batch_labels, centroids, config.temperature, aug_generator))
            step(None if out is None else out.loss)
            if network.target is not None:
                ema_update(network.target, network.online, config.ema_decay)
            steps += 1
            if out is not None:
                if out.target_reps is not None and memory is not None and position >= kept_from:
                    memory.push(out.target_reps, on_device)
                for name, value in out.values.items():
                    totals[name] = totals[name] + value.detach() if name in totals else value.detach()
                stepped_batches += 1
    events: tuple[PrivacyEvent, ...] = ()
    if dp is None:
        assert memory is not None  # built above for every run without DP-SGD
        kept, examples = memory.contents(), memory.examples()
    else:
        kept, examples, events = dp.private_memory_and_cost(network, images, config, generator=generator, device=device)
    return LocalTrainingResult(
        memory=kept, memory_examples=examples, num_samples=n, num_steps=steps,
        step_means=step_means(totals, stepped_batches), seconds=time.perf_counter() - start, privacy_events=events,
    )


def _on_device(
    batches: Iterator[torch.Tensor], device: torch.device, memory: RepresentationMemory | None
) -> tuple[Iterable[tuple[torch.Tensor, torch.Tensor]], int]:
    """Each batch's indices, also on ``device``; and the first batch whose representations can survive in ``memory``.

    With a memory (plain SGD) the schedule is copied to the device in one transfer up front, so no step waits
    on one; DP-SGD's batches are drawn as they come.
    """
    if memory is None:
        return ((index, index.to(device)) for index in batches), 0
    schedule = list(batches)
    sizes = [len(index) for index in schedule]
    moved = torch.cat(schedule).to(device).split(sizes) if schedule else ()
    return list(zip(schedule, moved)), first_kept_batch(sizes, memory.capacity)


def _dp_sgd_training() -> ModuleType:
    """:mod:`privfed.orchestra.dp_sgd_training`, imported only for DP-SGD: Opacus takes seconds to import."""
    from privfed.extras import require

    require("opacus", feature="DP-SGD (--dp-sgd)")
    from privfed.orchestra import dp_sgd_training

    return dp_sgd_training
