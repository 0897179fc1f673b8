"""Client side: one round of local training, the one loop every method and DP-SGD run through.

Three parts vary: the method's step (:meth:`privfed.methods.Method.step`:
what it computes from a batch), the batches (shuffled, or DP-SGD's secret
Poisson sample) and the optimizer step (SGD, or Opacus' clip-and-noise
step: :mod:`privfed.orchestra.dp_sgd_training`, imported only for DP-SGD).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from mechanisms.base import PrivacyEvent
from privfed.methods import Batch, Method, get_method
from privfed.models.network import OrchestraNetwork, ema_update
from privfed.orchestra.memory import RepresentationMemory
from privfed.privacy.dp_sgd_plan import DpSgdSettings

if TYPE_CHECKING:
    from privfed.config import TrainConfig

#: The round's batches (index tensors; an empty one still steps) and the optimizer step on a batch's loss (None: empty).
TrainingParts = tuple[Iterator[torch.Tensor], Callable[[torch.Tensor | None], None]]


@dataclass(frozen=True)
class LocalTrainingConfig:
    """Hyperparameters of a client's local update.

    It has no defaults of its own: build it from the run's configuration
    with :meth:`from_run`, so that what is trained, benchmarked and tested
    is what ``privfed train`` runs.

    ``dp_sgd`` switches local training to DP-SGD with those settings; the
    network must then use GroupNorm (``OrchestraNetwork(..., norm="group")``).
    ``method`` names the run's method (:mod:`privfed.methods`).
    """

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

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LocalTrainingConfig:
        """The inverse of :meth:`to_dict` for a configuration without DP-SGD settings (those travel apart)."""
        if values.get("dp_sgd") is not None:
            raise ValueError("DP-SGD settings travel separately from the local training configuration")
        return cls(**{**values, "dp_sgd": None})

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


def step_means(totals: dict[str, torch.Tensor], steps: int) -> dict[str, float]:
    """The per-step values averaged over ``steps`` (a client that took no step, with fewer than two images, has none).

    A value the method does not compute (NaN) is left out.
    """
    if steps == 0:
        return {}
    means = {name: float(total / steps) for name, total in totals.items()}
    return {name: value for name, value in means.items() if not math.isnan(value)}


def normalised_centroids(centroids: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """The global centroids on ``device``, L2-normalised (None stays None: a method without centroids)."""
    return None if centroids is None else F.normalize(centroids.to(device).float(), dim=1)


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
        network.trainable_parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )

    def step(loss: torch.Tensor | None) -> None:
        assert loss is not None  # shuffled batches are never empty
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    yield (index for _ in range(config.epochs) for index in shuffled_batches(n, config.batch_size, generator)), step


def train_locally(
    network: OrchestraNetwork,
    images: torch.Tensor,
    centroids: torch.Tensor | None,
    config: LocalTrainingConfig,
    *,
    generator: torch.Generator,
    device: torch.device,
    labels: torch.Tensor | None = None,
    secret_seed: int | None = None,
) -> LocalTrainingResult:
    """Runs one client's round of its method (``config.epochs`` epochs, or DP-SGD's steps when ``config.dp_sgd`` is set).

    The target encoder, if any, follows the online encoder by EMA after
    every step. The memory holds the target representations of the last
    batches, the latest view of each image only (empty when the method keeps
    none); under DP-SGD it is :func:`~privfed.orchestra.memory_sampling.poisson_memory`
    instead, and the result carries the round's DP-SGD cost.

    Args:
        network: Global network of the method's shape (GroupNorm under DP-SGD), trained in place.
        images: ``[n, 3, H, W]`` uint8 images of this client.
        centroids: ``[G, D]`` global centroids, fixed during local training (None for a method without them).
        config: Local hyperparameters.
        generator: The round's generator: shuffling, and the seed of the augmentations' generator on ``device``.
        device: Where to train.
        labels: ``[n]`` labels of ``images``, for a method that reads them.
        secret_seed: DP-SGD, tests only: seeds batch sampling and noise.
    """
    start = time.perf_counter()
    method = get_method(config.method)
    n = int(images.shape[0])
    network.to(device).train()
    centroids = normalised_centroids(centroids, device)
    aug_generator = augmentation_generator(generator, device)
    memory = RepresentationMemory(config.memory_size, network.projection_dim)
    totals: dict[str, torch.Tensor] = {}
    steps = stepped_batches = 0
    with _parts(network, n, config, method, generator=generator, device=device, secret_seed=secret_seed) as (batches, step):
        images = images.to(device)
        for index in batches:
            out = None
            if index.numel():
                batch_labels = None if labels is None else labels[index].to(device)
                batch = Batch(images[index.to(device)], batch_labels, centroids, config.temperature, aug_generator)
                out = method.step(network, batch)
            step(None if out is None else out.loss)
            if network.target is not None:
                ema_update(network.target, network.online, config.ema_decay)
            steps += 1
            if out is not None:
                if out.target_reps is not None:
                    memory.push(out.target_reps, index)
                for name, value in out.values.items():
                    totals[name] = totals[name] + value.detach() if name in totals else value.detach()
                stepped_batches += 1
    kept, examples = memory.contents(), memory.examples()
    events: tuple[PrivacyEvent, ...] = ()
    if config.dp_sgd is not None:
        from privfed.orchestra.dp_sgd_training import private_memory_and_cost

        kept, examples, events = private_memory_and_cost(network, images, config, generator=generator, device=device)
    return LocalTrainingResult(
        memory=kept,
        memory_examples=examples,
        num_samples=n,
        num_steps=steps,
        step_means=step_means(totals, stepped_batches),
        seconds=time.perf_counter() - start,
        privacy_events=events,
    )


def _parts(
    network: OrchestraNetwork,
    n: int,
    config: LocalTrainingConfig,
    method: Method,
    *,
    generator: torch.Generator,
    device: torch.device,
    secret_seed: int | None,
) -> AbstractContextManager[TrainingParts]:
    if config.dp_sgd is None:
        return sgd_parts(network, n, config, generator=generator)
    # Imported here: Opacus takes seconds to import, and most runs never need it (nor install it).
    from privfed.extras import require

    require("opacus", feature="DP-SGD (--dp-sgd)")
    from privfed.orchestra.dp_sgd_training import dp_sgd_parts

    return dp_sgd_parts(network, n, config, method, device=device, secret_seed=secret_seed)
