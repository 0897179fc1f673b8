"""Representations and releases the server makes from its own auxiliary images, without any client's data:
the mechanism-aware decoder trains on them, and the null reconstruction (:mod:`attacks.evaluation`) inverts them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attacks.base import AttackTarget
from mechanisms import Mechanism, ReleaseMechanism, SecureSumMechanism, create_mechanism
from privfed.data.augment import orchestra_views, to_float


@torch.no_grad()
def aux_views_and_representations(
    target: AttackTarget, aux_images: torch.Tensor, *, generator: torch.Generator, passes: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[passes * N, D]`` representations of views of every auxiliary image, and the image of each, as a
    client computes them (Orchestra's first view, training mode, batches of its batch size)."""
    (reps,), index = views_through([target], aux_images, generator=generator, passes=passes)
    return reps, index


@torch.no_grad()
def views_through(
    targets: list[AttackTarget], aux_images: torch.Tensor, *, generator: torch.Generator, passes: int = 1
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """:func:`aux_views_and_representations` under each target's encoder, the same views for all (batches of the
    first target's batch size, on its device)."""
    encoders = [target.frozen_encoder().train() for target in targets]
    device, batch_size = targets[0].device, targets[0].batch_size
    aug = torch.Generator(device=device).manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
    reps: list[list[torch.Tensor]] = [[] for _ in encoders]
    index = []
    for _ in range(passes):
        order = torch.randperm(aux_images.shape[0], generator=generator)
        for batch in order.split(max(batch_size, 2)):
            if batch.numel() < 2:
                continue  # BatchNorm needs two
            view = orchestra_views(aux_images[batch].to(device), generator=aug).view1
            for out, encoder in zip(reps, encoders):
                out.append(torch.nn.functional.normalize(encoder(view), dim=1).cpu())
            index.append(batch)
    return [torch.cat(out) for out in reps], torch.cat(index)


@dataclass(frozen=True)
class AuxReleases:
    """Released vectors with weight of simulated auxiliary clients, each with its members' mean image (the
    whole memory's when the mechanism cannot say which rows fed it)."""

    vectors: torch.Tensor
    member_means: torch.Tensor


def aux_releases(
    target: AttackTarget,
    reps: torch.Tensor,
    image_of_rep: torch.Tensor,
    aux_images: torch.Tensor,
    *,
    num_memories: int,
    generator: torch.Generator,
) -> AuxReleases:
    """The round's mechanism run on ``num_memories`` memories of ``memory_size`` distinct auxiliary images."""
    mechanism = round_mechanism(target)
    images = to_float(aux_images)
    size = min(target.memory_size, aux_images.shape[0])
    vectors, means = [], []
    for _ in range(num_memories):
        rows = _distinct_image_rows(image_of_rep, size, generator)
        release, members = mechanism.release_with_members(
            reps[rows], num_centroids=target.num_local_centroids, generator=generator
        )
        member_images = images[image_of_rep[rows]]
        for j in torch.nonzero(release.weights > 0).squeeze(1).tolist():
            chosen = member_images if members is None else member_images[members == j]
            if chosen.shape[0]:
                vectors.append(release.vectors[j].float())
                means.append(chosen.mean(dim=0))
    if not vectors:
        dim = reps.shape[1]
        return AuxReleases(torch.zeros(0, dim), torch.zeros(0, *aux_images.shape[1:]))
    return AuxReleases(torch.stack(vectors), torch.stack(means))


def _distinct_image_rows(image_of_rep: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """``size`` rows of distinct images (a memory holds one view per image)."""
    order = torch.randperm(image_of_rep.shape[0], generator=generator)
    seen: set[int] = set()
    rows = []
    for row in order.tolist():
        image = int(image_of_rep[row])
        if image not in seen:
            seen.add(image)
            rows.append(row)
            if len(rows) == size:
                break
    return torch.tensor(rows, dtype=torch.long)



def released_again(
    target: AttackTarget, images: torch.Tensor, *, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(vectors, weights)`` the round's mechanism releases of one fresh view of each of ``images``: a
    simulated client that holds the same images every round (the cross-round null)."""
    mechanism = round_mechanism(target)
    reps, _ = aux_views_and_representations(target, images, generator=generator)
    release = mechanism.release(reps, num_centroids=target.num_local_centroids, generator=generator)
    return release.vectors.float(), release.weights.float()


def round_mechanism(target: AttackTarget) -> ReleaseMechanism:
    """The round's mechanism with the run's parameters, having seen the round's global centroids."""
    mechanism = _observed(target)
    if not isinstance(mechanism, ReleaseMechanism):
        raise ValueError(f"mechanism {target.mechanism} releases nothing per client")
    return mechanism


def _observed(target: AttackTarget) -> Mechanism:
    mechanism = create_mechanism(target.mechanism, **target.mechanism_params)
    if target.centroids is not None:
        mechanism.observe_global_centroids(target.centroids)
    return mechanism


def summed_again(
    target: AttackTarget, memories: list[torch.Tensor], *, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(vectors, weights)`` the server decodes from a secure sum of simulated clients, one per uint8 memory of
    auxiliary images, each sending the round's share (its own noise included): a secure sum's null."""
    mechanism = _observed(target)
    if not isinstance(mechanism, SecureSumMechanism) or target.centroids is None:
        raise ValueError(f"mechanism {target.mechanism} sends no secure sum in round {target.round}")
    modulus = int(target.mechanism_params["modulus"])
    total: np.ndarray | None = None
    for images in memories:
        reps, _ = aux_views_and_representations(target, images, generator=generator)
        share = mechanism.share(reps, num_centroids=target.num_local_centroids, generator=generator).astype(np.int64)
        total = share % modulus if total is None else (total + share) % modulus
    if total is None:
        raise ValueError("a secure sum needs at least one share")
    cells, dim = target.centroids.shape
    decoded = mechanism.decode(total, num_cells=cells, dim=dim)
    if decoded is None:
        raise ValueError(f"mechanism {target.mechanism} does not say what the server reads from its sum")
    return decoded[0].float(), decoded[1].float()
