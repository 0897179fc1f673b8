"""The memories a client builds outside its training loop, from target representations of fresh views:
round 0's, DP-SGD's Poisson sample, and every image's (for a mechanism that samples in secret)."""

from __future__ import annotations

import torch

from privfed.data.augment import orchestra_views
from privfed.methods import get_method
from privfed.models.network import OrchestraNetwork
from privfed.orchestra.local_training import LocalTrainingConfig, augmentation_generator
from privfed.privacy.dp_sgd_plan import memory_rate


def initial_representations(
    network: OrchestraNetwork,
    images: torch.Tensor,
    config: LocalTrainingConfig,
    *,
    generator: torch.Generator,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round 0 (without DP-SGD): target representations of up to ``memory_size`` augmented images, and which.

    The network changes only in the target's BatchNorm statistics, which the caller discards.
    """
    aug_generator = augmentation_generator(generator, device)
    chosen = torch.randperm(images.shape[0], generator=generator)[: config.memory_size]
    batches = [index for index in chosen.split(max(config.batch_size, 2)) if len(index) >= 2]  # BatchNorm needs two
    return _target_representations(network, images, batches, config, aug_generator=aug_generator, device=device)


@torch.no_grad()
def _target_representations(
    network: OrchestraNetwork,
    images: torch.Tensor,
    batches: list[torch.Tensor],
    config: LocalTrainingConfig,
    *,
    aug_generator: torch.Generator,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target representations of view 1 of the images in ``batches``, on the CPU (``[0, D]`` if none), and their indices."""
    network.to(device).train()
    method = get_method(config.method)
    reps = [
        method.representations(network, orchestra_views(images[index].to(device), generator=aug_generator).view1)
        for index in batches
    ]
    if not reps:
        return torch.zeros(0, network.projection_dim), torch.zeros(0, dtype=torch.long)
    return torch.cat(reps).cpu(), torch.cat(batches).cpu()


def every_representation(
    network: OrchestraNetwork,
    images: torch.Tensor,
    config: LocalTrainingConfig,
    *,
    generator: torch.Generator,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One target representation of every image, for a mechanism that samples its input in secret (not from
    ``generator``, whose seed the server knows). Under DP-SGD each row must depend on its own image only."""
    if config.dp_sgd is not None and network.norm != "group":
        raise ValueError("under DP-SGD a release's rows need a GroupNorm network: BatchNorm mixes examples")
    aug_generator = augmentation_generator(generator, device)
    n = images.shape[0]
    order = torch.randperm(n, generator=generator)
    # Batches of batch_size to twice that, none of one image (BatchNorm needs two): a lone image of a
    # BatchNorm network is left out, which only makes its sample smaller.
    batches = [index for index in order.tensor_split(max(1, n // max(config.batch_size, 2))) if len(index) >= 2 or network.norm == "group"]
    return _target_representations(network, images, batches, config, aug_generator=aug_generator, device=device)


def poisson_sample(num_samples: int, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of a Poisson sample: each example independently with probability ``rate``."""
    return torch.nonzero(torch.rand(num_samples, generator=generator) < rate).squeeze(1)


def poisson_memory(
    network: OrchestraNetwork,
    images: torch.Tensor,
    config: LocalTrainingConfig,
    *,
    generator: torch.Generator,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The memory under DP-SGD: one target representation (view 1) per example of a Poisson sample, and which.

    Each example joins independently at :func:`~privfed.privacy.dp_sgd_plan.memory_rate`,
    uncapped, and a GroupNorm row depends on its own example only: one example
    changes at most one row, so the release's per-representation guarantee is
    per example and composes with DP-SGD's. No amplification is claimed, so
    the reproducible ``generator`` may draw it.
    """
    if network.norm != "group":
        raise ValueError("a Poisson memory needs a GroupNorm network: BatchNorm mixes examples")
    n = images.shape[0]
    aug_generator = augmentation_generator(generator, device)
    chosen = poisson_sample(n, memory_rate(n, config.memory_size), generator)
    batches = list(chosen.split(max(config.batch_size, 1)))
    return _target_representations(network, images, batches, config, aug_generator=aug_generator, device=device)
