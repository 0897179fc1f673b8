"""Client side: one round of plain Orchestra local training.

Its DP-SGD counterpart is :mod:`privfed.orchestra.dp_sgd_training`; which of
the two runs is :func:`privfed.orchestra.client_update.client_update`'s
choice. The objective both minimise is in :mod:`privfed.orchestra.objective`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from mechanisms.base import PrivacyEvent
from privfed.data.augment import orchestra_views
from privfed.methods import Objective, get_method
from privfed.models.network import OrchestraNetwork, ema_update
from privfed.orchestra.memory import RepresentationMemory
from privfed.orchestra.objective import STEP_VALUES, augmentation_generator, orchestra_losses
from privfed.privacy.dp_sgd_plan import DpSgdSettings

if TYPE_CHECKING:
    from privfed.config import TrainConfig


@dataclass(frozen=True)
class LocalTrainingConfig:
    """Hyperparameters of a client's local update.

    It has no defaults of its own: build it from the run's configuration
    with :meth:`from_run`, so that what is trained, benchmarked and tested
    is what ``privfed train`` runs.

    ``dp_sgd`` switches local training to DP-SGD with those settings; the
    network must then use GroupNorm (``OrchestraNetwork(..., norm="group")``).
    ``objective`` is the run's method's (:mod:`privfed.methods`).
    """

    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    temperature: float
    ema_decay: float
    memory_size: int
    objective: Objective
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
            objective=get_method(config.method).objective,
            dp_sgd=dp_sgd,
        )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LocalTrainingConfig:
        """The inverse of :meth:`to_dict` for a configuration without DP-SGD settings (those travel apart)."""
        if values.get("dp_sgd") is not None:
            raise ValueError("DP-SGD settings travel separately from the local training configuration")
        return cls(**{**values, "objective": Objective(**values["objective"]), "dp_sgd": None})

    def replace(self, **changes: Any) -> LocalTrainingConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LocalTrainingResult:
    """What local training produced; ``memory`` and ``memory_examples`` stay on the client.

    ``memory_examples[i]`` is the client example memory row ``i`` is a view
    of (kept for replays that score attacks). ``privacy_events`` is the DP-SGD cost of this round (empty without DP-SGD).
    The loss values are local diagnostics: under DP-SGD they are not covered
    by the guarantee and must not leave the client.
    """

    memory: torch.Tensor
    memory_examples: torch.Tensor
    num_samples: int
    num_steps: int
    step_means: dict[str, float]
    seconds: float
    privacy_events: tuple[PrivacyEvent, ...] = ()


def step_means(totals: torch.Tensor, steps: int) -> dict[str, float]:
    """The :data:`~privfed.orchestra.objective.STEP_VALUES` averaged over ``steps``.

    A client that took no step (fewer than two images) has no means, so it
    adds nothing to the round's averages rather than zeros. A value the
    method does not compute (NaN: no centroids, no target entropy) is left
    out.
    """
    if steps == 0:
        return {}
    means = zip(STEP_VALUES, (totals / steps).tolist())
    return {name: value for name, value in means if not math.isnan(value)}


def normalised_centroids(centroids: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """The global centroids on ``device``, L2-normalised (None stays None: a method without centroids)."""
    return None if centroids is None else F.normalize(centroids.to(device).float(), dim=1)


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffled index batches; a trailing batch of one is dropped (BatchNorm needs two)."""
    order = torch.randperm(n, generator=generator)
    batches = list(order.split(batch_size))
    if batches and len(batches[-1]) < 2:
        batches.pop()
    return batches


def train_locally(
    network: OrchestraNetwork,
    images: torch.Tensor,
    centroids: torch.Tensor | None,
    config: LocalTrainingConfig,
    *,
    generator: torch.Generator,
    device: torch.device,
) -> LocalTrainingResult:
    """Runs ``config.epochs`` epochs of Orchestra (or an ablation) on one client's images.

    Per batch at most three encoder passes run: target on view 1, online on
    view 2 (cluster loss) and online on the rotated view 3 (rotation loss).
    The target follows the online encoder by EMA after every step. The
    memory holds the last batches' target representations, the latest view
    of each image only (empty when the method has no cluster loss).

    Args:
        network: Global network, trained in place.
        images: ``[n, 3, H, W]`` uint8 images of this client.
        centroids: ``[G, D]`` global centroids, fixed during local training
            (None for a method without centroids).
        config: Local hyperparameters.
        generator: CPU generator for shuffling; augmentation randomness is
            drawn from a generator on ``device`` seeded from it.
        device: Where to train.
    """
    if config.dp_sgd is not None:
        raise ValueError("config.dp_sgd is set: DP-SGD training is privfed.orchestra.dp_sgd_training.train_with_dp_sgd")
    start = time.perf_counter()
    network.to(device).train()
    centroids = normalised_centroids(centroids, device)
    aug_generator = augmentation_generator(generator, device)
    optimizer = torch.optim.SGD(
        network.trainable_parameters(),
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )
    memory = RepresentationMemory(config.memory_size, network.projection_dim)
    images = images.to(device)
    totals = torch.zeros(len(STEP_VALUES), device=device)
    steps = 0
    for _ in range(config.epochs):
        for index in shuffled_batches(images.shape[0], config.batch_size, generator):
            views = orchestra_views(images[index.to(device)], generator=aug_generator)
            losses = orchestra_losses(network, views, centroids, config.temperature, config.objective)
            optimizer.zero_grad(set_to_none=True)
            losses.total.backward()
            optimizer.step()
            assert network.target is not None  # Orchestra's network always has one
            ema_update(network.target, network.online, config.ema_decay)
            if losses.target_reps is not None:
                memory.push(losses.target_reps, index)
            totals += losses.detached()
            steps += 1
    return LocalTrainingResult(
        memory=memory.contents(),
        memory_examples=memory.examples(),
        num_samples=int(images.shape[0]),
        num_steps=steps,
        step_means=step_means(totals, steps),
        seconds=time.perf_counter() - start,
    )
