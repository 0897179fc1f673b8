"""Client side: one round of Orchestra local training, and round-0 initialisation.

With ``LocalTrainingConfig.dp_sgd`` set, training runs DP-SGD instead (see
:mod:`privfed.orchestra.dp_sgd`) and the memory of representations is a
Poisson sample of the client's examples, at most one representation each,
rather than the last training batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mechanisms.base import PrivacyEvent
from privfed.data.augment import OrchestraViews, orchestra_views
from privfed.models.network import OrchestraNetwork, ema_update
from privfed.orchestra.loss import cluster_consistency_loss, rotation_loss
from privfed.orchestra.memory import RepresentationMemory
from privfed.privacy.dp_sgd import DpSgdSettings


@dataclass(frozen=True)
class LocalTrainingConfig:
    """Hyperparameters of a client's local update (paper defaults, cross-device).

    ``dp_sgd`` switches local training to DP-SGD with those settings; the
    network must then use GroupNorm (``OrchestraNetwork(..., norm="group")``).
    """

    epochs: int = 10
    batch_size: int = 16
    lr: float = 0.003
    momentum: float = 0.9
    weight_decay: float = 1e-4
    temperature: float = 0.1
    ema_decay: float = 0.996
    memory_size: int = 128
    dp_sgd: DpSgdSettings | None = None


@dataclass(frozen=True)
class LocalTrainingResult:
    """What local training produced; ``memory`` stays on the client.

    ``privacy_events`` is the DP-SGD cost of this round (empty without DP-SGD).
    The loss values are local diagnostics: under DP-SGD they are not covered
    by the guarantee and must not leave the client.
    """

    memory: torch.Tensor
    num_samples: int
    num_steps: int
    loss: float
    cluster_loss: float
    rotation_loss: float
    seconds: float
    privacy_events: tuple[PrivacyEvent, ...] = ()


@dataclass(frozen=True)
class StepLosses:
    """Orchestra's objective on one batch, with the target representations it used."""

    total: torch.Tensor
    cluster: torch.Tensor
    rotation: torch.Tensor
    target_reps: torch.Tensor

    def detached(self) -> torch.Tensor:
        return torch.stack([self.total.detach(), self.cluster.detach(), self.rotation.detach()])


def orchestra_losses(
    network: OrchestraNetwork, views: OrchestraViews, centroids: torch.Tensor, temperature: float
) -> StepLosses:
    """The three encoder passes of one step and the loss they give.

    Target on view 1, online on view 2 (cluster loss), online on the rotated
    view 3 (rotation loss). Each sample's loss depends on that sample alone
    once the network has no BatchNorm, which is what DP-SGD's per-sample
    gradients need: the cluster targets are per-sample softmaxes, no
    batch-level balancing.
    """
    target_reps = network.target_representation(views.view1)
    online_reps = F.normalize(network.online_embedding(views.view2), dim=1)
    rotation_logits = network.rotation(network.online_embedding(views.view3))
    l_cluster = cluster_consistency_loss(target_reps, online_reps, centroids, temperature)
    l_rotation = rotation_loss(rotation_logits, views.rotation_labels)
    return StepLosses(l_cluster + l_rotation, l_cluster, l_rotation, target_reps)


def augmentation_generator(generator: torch.Generator, device: torch.device) -> torch.Generator:
    """A generator on ``device`` for the views, seeded from the round's ``generator``."""
    aug_generator = torch.Generator(device=device)
    aug_generator.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
    return aug_generator


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
    secret_seed: int | None = None,
) -> LocalTrainingResult:
    """Runs ``config.epochs`` epochs of Orchestra on one client's images.

    Per batch only three encoder passes run: target on view 1, online on
    view 2 (cluster loss) and online on the rotated view 3 (rotation loss).
    The target follows the online encoder by EMA after every step. With
    ``config.dp_sgd`` set this is DP-SGD instead
    (:func:`privfed.orchestra.dp_sgd.train_with_dp_sgd`).

    Args:
        network: Global network, trained in place.
        images: ``[n, 3, H, W]`` uint8 images of this client.
        centroids: ``[G, D]`` global centroids, fixed during local training.
        config: Local hyperparameters.
        generator: CPU generator for shuffling; augmentation randomness is
            drawn from a generator on ``device`` seeded from it.
        device: Where to train.
        secret_seed: DP-SGD only, for tests: seeds batch sampling and noise,
            which otherwise come from the operating system's randomness. A
            seed the server can know voids the guarantee.
    """
    if config.dp_sgd is not None:
        from privfed.orchestra.dp_sgd import train_with_dp_sgd  # imports this module

        return train_with_dp_sgd(
            network, images, centroids, config, generator=generator, device=device, secret_seed=secret_seed
        )
    start = time.perf_counter()
    network.to(device).train()
    centroids = F.normalize(centroids.to(device).float(), dim=1)
    aug_generator = augmentation_generator(generator, device)
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
            losses = orchestra_losses(network, views, centroids, config.temperature)
            optimizer.zero_grad(set_to_none=True)
            losses.total.backward()
            optimizer.step()
            ema_update(network.target, network.online, config.ema_decay)
            memory.push(losses.target_reps)
            totals += losses.detached()
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
    Under DP-SGD the memory is :func:`poisson_memory`, as after training.
    """
    if config.dp_sgd is not None:
        return poisson_memory(network, images, config, generator=generator, device=device)
    network.to(device).train()
    aug_generator = augmentation_generator(generator, device)
    chosen = torch.randperm(images.shape[0], generator=generator)[: config.memory_size]
    batches = [index for index in chosen.split(max(config.batch_size, 2)) if len(index) >= 2]  # BatchNorm needs two
    return _target_representations(network, images, batches, aug_generator=aug_generator, device=device)


def _target_representations(
    network: OrchestraNetwork,
    images: torch.Tensor,
    batches: list[torch.Tensor],
    *,
    aug_generator: torch.Generator,
    device: torch.device,
) -> torch.Tensor:
    """Target representations of view 1 of the images in ``batches``, on the CPU (``[0, D]`` if none)."""
    reps = [
        network.target_representation(orchestra_views(images[index].to(device), generator=aug_generator).view1)
        for index in batches
    ]
    if not reps:
        return torch.zeros(0, network.rotation.in_features)
    return torch.cat(reps).cpu()


def poisson_sample(num_samples: int, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of a Poisson sample: each example independently with probability ``rate``."""
    return torch.nonzero(torch.rand(num_samples, generator=generator) < rate).squeeze(1)


def memory_sampling_rate(num_samples: int, memory_size: int) -> float:
    """Rate of :func:`poisson_memory`'s sample: ``memory_size`` examples expected."""
    return min(1.0, memory_size / max(num_samples, 1))


@torch.no_grad()
def poisson_memory(
    network: OrchestraNetwork,
    images: torch.Tensor,
    config: LocalTrainingConfig,
    *,
    generator: torch.Generator,
    device: torch.device,
) -> torch.Tensor:
    """The memory under DP-SGD: one target representation per example of a Poisson sample.

    Each example joins independently with probability
    ``min(1, memory_size / n)``, with no cap on the total, so removing one
    example removes at most one representation and changes no other: the
    release mechanism's per-representation guarantee is then a per-example
    one, and composes with DP-SGD's in one ledger. (Training batches cannot
    serve: a Poisson batch sequence may use an example many times.) No
    amplification is claimed from this sample, so its randomness may come
    from the round's reproducible ``generator``.

    The network must use GroupNorm, so each representation depends on its
    own example only.

    Returns:
        ``[m, D]`` L2-normalised target representations of one augmented
        view (view 1) each, ``m`` random with mean ``min(n, memory_size)``.
    """
    if network.norm != "group":
        raise ValueError("a Poisson memory needs a GroupNorm network: BatchNorm mixes examples")
    network.to(device).train()
    n = images.shape[0]
    aug_generator = augmentation_generator(generator, device)
    chosen = poisson_sample(n, memory_sampling_rate(n, config.memory_size), generator)
    batches = list(chosen.split(max(config.batch_size, 1)))
    return _target_representations(network, images, batches, aug_generator=aug_generator, device=device)
