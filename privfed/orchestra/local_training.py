"""Client side: one round of Orchestra local training, and round-0 initialisation."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from privfed.data.augment import orchestra_views
from privfed.models.network import OrchestraNetwork, ema_update
from privfed.orchestra.loss import cluster_consistency_loss, rotation_loss
from privfed.orchestra.memory import RepresentationMemory


@dataclass(frozen=True)
class LocalTrainingConfig:
    """Hyperparameters of a client's local update (paper defaults, cross-device)."""

    epochs: int = 10
    batch_size: int = 16
    lr: float = 0.003
    momentum: float = 0.9
    weight_decay: float = 1e-4
    temperature: float = 0.1
    ema_decay: float = 0.996
    memory_size: int = 128


@dataclass(frozen=True)
class LocalTrainingResult:
    """What local training produced; ``memory`` stays on the client."""

    memory: torch.Tensor
    num_samples: int
    num_steps: int
    loss: float
    cluster_loss: float
    rotation_loss: float
    seconds: float


def _batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffled index batches; a trailing batch of one is dropped (BatchNorm needs two)."""
    order = torch.randperm(n, generator=generator)
    batches = list(order.split(batch_size))
    if batches and len(batches[-1]) < 2:
        batches.pop()
    return batches


def train_locally(
    network: OrchestraNetwork,
    images: torch.Tensor,
    centroids: torch.Tensor,
    config: LocalTrainingConfig,
    *,
    generator: torch.Generator,
    device: torch.device,
) -> LocalTrainingResult:
    """Runs ``config.epochs`` epochs of Orchestra on one client's images.

    Per batch only three encoder passes run: target on view 1, online on
    view 2 (cluster loss) and online on the rotated view 3 (rotation loss).
    The target follows the online encoder by EMA after every step.

    Args:
        network: Global network, trained in place.
        images: ``[n, 3, H, W]`` uint8 images of this client.
        centroids: ``[G, D]`` global centroids, fixed during local training.
        config: Local hyperparameters.
        generator: CPU generator for shuffling; augmentation randomness is
            drawn from a generator on ``device`` seeded from it.
        device: Where to train.
    """
    start = time.perf_counter()
    network.to(device).train()
    centroids = F.normalize(centroids.to(device).float(), dim=1)
    aug_generator = torch.Generator(device=device)
    aug_generator.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
    optimizer = torch.optim.SGD(
        network.trainable_parameters(),
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )
    memory = RepresentationMemory(config.memory_size, centroids.shape[1])
    images = images.to(device)
    totals = torch.zeros(3, device=device)
    steps = 0
    for _ in range(config.epochs):
        for index in _batches(images.shape[0], config.batch_size, generator):
            views = orchestra_views(images[index.to(device)], generator=aug_generator)
            target_reps = network.target_representation(views.view1)
            online_reps = F.normalize(network.online_embedding(views.view2), dim=1)
            rotation_logits = network.rotation(network.online_embedding(views.view3))
            l_cluster = cluster_consistency_loss(target_reps, online_reps, centroids, config.temperature)
            l_rotation = rotation_loss(rotation_logits, views.rotation_labels)
            loss = l_cluster + l_rotation
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            ema_update(network.target, network.online, config.ema_decay)
            memory.push(target_reps)
            totals += torch.stack([loss.detach(), l_cluster.detach(), l_rotation.detach()])
            steps += 1
    means = (totals / max(steps, 1)).tolist()
    return LocalTrainingResult(
        memory=memory.contents(),
        num_samples=int(images.shape[0]),
        num_steps=steps,
        loss=means[0],
        cluster_loss=means[1],
        rotation_loss=means[2],
        seconds=time.perf_counter() - start,
    )


@torch.no_grad()
def initial_representations(
    network: OrchestraNetwork,
    images: torch.Tensor,
    config: LocalTrainingConfig,
    *,
    generator: torch.Generator,
    device: torch.device,
) -> torch.Tensor:
    """Round 0: target representations of up to ``memory_size`` augmented images.

    Fills the same memory local training would, without training, so the
    server can form the first global centroids. The network is left unchanged
    apart from the target's BatchNorm statistics, which the caller discards.
    """
    network.to(device).train()
    aug_generator = torch.Generator(device=device)
    aug_generator.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
    chosen = torch.randperm(images.shape[0], generator=generator)[: config.memory_size]
    reps = []
    for index in chosen.split(max(config.batch_size, 2)):
        if len(index) < 2:
            continue
        views = orchestra_views(images[index].to(device), generator=aug_generator)
        reps.append(network.target_representation(views.view1))
    if not reps:
        return torch.zeros(0, network.rotation.in_features)
    return torch.cat(reps).cpu()
