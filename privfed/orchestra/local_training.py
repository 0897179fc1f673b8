"""Client side: the plain parts of the local-training loop (:func:`privfed.orchestra.client_update.train_locally`);
the DP-SGD parts are in :mod:`privfed.orchestra.dp_sgd_training`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from mechanisms.base import PrivacyEvent
from privfed.models.network import OrchestraNetwork
from privfed.privacy.dp_sgd_plan import DpSgdSettings

if TYPE_CHECKING:
    from privfed.config import TrainConfig

#: The round's batches (index tensors; an empty one still steps) and the optimizer step on a batch's loss (None: empty).
TrainingParts = tuple[Iterator[torch.Tensor], Callable[[torch.Tensor | None], None]]


@dataclass(frozen=True)
class LocalTrainingConfig:
    """Hyperparameters of a client's local update; :meth:`from_run` builds it, so what is trained, benchmarked
    and tested is what ``privfed train`` runs. ``dp_sgd`` switches to DP-SGD (on a GroupNorm network)."""

    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    temperature: float
    ema_decay: float
    memory_size: int
    method: str
    dp_sgd: DpSgdSettings | None

    @classmethod
    def from_run(cls, config: TrainConfig, dp_sgd: DpSgdSettings | None = None) -> LocalTrainingConfig:
        """The local fields of a run's configuration; ``dp_sgd`` comes from the server's plan, not the config."""
        return cls(
            epochs=config.local_epochs,
            batch_size=config.batch_size,
            lr=config.lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            temperature=config.temperature,
            ema_decay=config.ema_decay,
            memory_size=config.memory_size,
            method=config.method,
            dp_sgd=dp_sgd,
        )

    def replace(self, **changes: Any) -> LocalTrainingConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class LocalTrainingResult:
    """What local training produced; ``memory`` and ``memory_examples`` (each row's example) stay on the client,
    and so must the loss values under DP-SGD, whose guarantee does not cover them."""

    memory: torch.Tensor
    memory_examples: torch.Tensor
    num_samples: int
    num_steps: int
    step_means: dict[str, float]
    seconds: float
    privacy_events: tuple[PrivacyEvent, ...] = ()


def step_means(totals: dict[str, torch.Tensor], steps: int) -> dict[str, float]:
    """The per-step values averaged over ``steps``, NaNs left out (none for a client that took no step)."""
    means = {name: float(total / steps) for name, total in totals.items()} if steps else {}
    return {name: mean for name, mean in means.items() if not math.isnan(mean)}


def normalised_centroids(centroids: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """The global centroids on ``device`` in torch's default dtype, L2-normalised (None stays None)."""
    return None if centroids is None else F.normalize(centroids.to(device, torch.get_default_dtype()), dim=1)


def augmentation_generator(generator: torch.Generator, device: torch.device) -> torch.Generator:
    """A generator on ``device`` for the views, seeded from the round's ``generator``."""
    aug_generator = torch.Generator(device=device)
    aug_generator.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
    return aug_generator


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffled index batches; a trailing batch of one is dropped (BatchNorm needs two)."""
    order = torch.randperm(n, generator=generator)
    batches = list(order.split(batch_size))
    if batches and len(batches[-1]) < 2:
        batches.pop()
    return batches


@contextmanager
def sgd_parts(network: OrchestraNetwork, n: int, config: LocalTrainingConfig, *, generator: torch.Generator) -> Iterator[TrainingParts]:
    """Every epoch's shuffled batches, and plain SGD with momentum and weight decay."""
    optimizer = torch.optim.SGD(
        network.trainable_parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
        foreach=True,  # a few fused launches per step on any device (torch picks it only on CUDA by default)
    )

    def step(loss: torch.Tensor | None) -> None:
        assert loss is not None  # shuffled batches are never empty
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    yield (index for _ in range(config.epochs) for index in shuffled_batches(n, config.batch_size, generator)), step
