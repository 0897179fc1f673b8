"""Which images stand behind each released vector, recomputed by replaying the client's round and checked
against the recording; a DP release's OS noise cannot be replayed, so its members stay unknown (docs/attacks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mechanisms import create_mechanism, get_mechanism_class
from mechanisms.base import Mechanism, Release, ReleaseMechanism, checked_release_with_members
from privfed.config import TrainConfig
from privfed.data.federated import FederatedSplit
from privfed.device import resolve_device
from privfed.federation.client import client_seed
from privfed.methods import build_network
from privfed.orchestra.client_update import run_client_round
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.privacy.budget import plan_privacy
from privfed.run.recording import RecordedRelease, RecordedRound

#: How membership was established.
VERIFIED = "replayed and matches the recorded release"
NOT_REPLAYABLE = "unknown: the mechanism draws noise the replay cannot repeat"
REPLAY_DIFFERS = "unknown: the replayed release differs from the recorded one"
NO_MEMBERS = "unknown: the mechanism does not say which rows fed a vector"


@dataclass(frozen=True)
class ClientMemory:
    """One client's uint8 dataset, and its replayed memory and each row's example in one round (None: not replayed)."""

    client: int
    images: torch.Tensor
    memory: torch.Tensor | None
    memory_examples: torch.Tensor | None


@dataclass(frozen=True)
class VectorTruth:
    """The client examples whose representations fed one released vector (one for ``reps``; None: unknown)."""

    client: int
    members: torch.Tensor | None


def replay_round(
    config: TrainConfig, recorded: RecordedRound, client: int
) -> tuple[ClientMemory, Release | None, torch.Tensor | None]:
    """Replays one client's round as it ran (device and thread count, which float reductions follow; a CUDA run
    may differ, as :func:`recorded_truth` notices): its memory, the replayed release and the rows' members."""
    split = FederatedSplit.of(config)
    dp_sgd = plan_privacy(config, split.client_sizes()).dp_sgd if config.dp_sgd else None
    local = LocalTrainingConfig.from_run(config, dp_sgd=None if dp_sgd is None else dp_sgd.settings)
    images = split.client_images(client)
    mechanism = _mechanism(recorded)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(config.client_cpus)))  # as the client ran it: reductions follow the thread count
    try:
        update, private = run_client_round(
            build_network(config),
            recorded.model_state,
            recorded.centroids,
            images,
            train=recorded.round > 0,
            config=local,
            mechanism=mechanism,
            num_local_centroids=config.num_local_centroids,
            seed=client_seed(config.seed, recorded.round, client),
            device=resolve_device(config.device),
        )
    finally:
        torch.set_num_threads(threads)
    memory = ClientMemory(client, images, private.memory, private.memory_examples)
    if update.release is None:
        return memory, None, None
    # The same mechanism choices again, this time with the members they make.
    assert private.memory is not None and private.release_generator_state is not None  # kept by a round that released
    assert isinstance(mechanism, ReleaseMechanism)  # only a release mechanism's round releases
    replayed, members = checked_release_with_members(
        mechanism, private.memory, num_centroids=config.num_local_centroids,
        generator=torch.Generator().set_state(private.release_generator_state),
    )
    return memory, replayed, members


def recorded_truth(
    config: TrainConfig, recorded: RecordedRound, release: RecordedRelease
) -> tuple[ClientMemory, list[VectorTruth], str]:
    """The truth behind every vector of one recorded release, and how it was established (a DP release's round
    is not replayed: only the client's images are known)."""
    if get_mechanism_class(recorded.mechanism).is_differentially_private():
        memory = ClientMemory(release.client, FederatedSplit.of(config).client_images(release.client), None, None)
        return memory, vector_truths(memory, None, release.vectors.shape[0]), NOT_REPLAYABLE
    memory, replayed, members = replay_round(config, recorded, release.client)
    if members is None:
        status = NO_MEMBERS
    elif replayed is None or not _same_vectors(replayed.vectors, release.vectors):
        status = REPLAY_DIFFERS
    else:
        status = VERIFIED
    known = members if status == VERIFIED else None
    return memory, vector_truths(memory, known, release.vectors.shape[0]), status


def vector_truths(memory: ClientMemory, members: torch.Tensor | None, num_vectors: int) -> list[VectorTruth]:
    """Per released vector, the client examples whose memory rows fed it (None throughout when unknown)."""
    if members is None or memory.memory_examples is None:
        return [VectorTruth(memory.client, None) for _ in range(num_vectors)]
    return [VectorTruth(memory.client, memory.memory_examples[members == j]) for j in range(num_vectors)]


def training_images(config: TrainConfig) -> torch.Tensor:
    """``[N, 3, H, W]`` uint8: every image any client of the run holds."""
    split = FederatedSplit.of(config)
    return split.train_data().subset(torch.cat([torch.as_tensor(p) for p in split.partition()]).numpy()).to_tensor()


def _mechanism(recorded: RecordedRound) -> Mechanism:
    mechanism = create_mechanism(recorded.mechanism, **recorded.mechanism_params)
    if recorded.centroids is not None:
        mechanism.observe_global_centroids(recorded.centroids)
    return mechanism


def _same_vectors(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), atol=1e-4))
