"""Orchestra local training as DP-SGD, with Opacus.

Each of the round's ``local_epochs * ceil(n / batch_size)`` steps:

1. draws a Poisson batch: every example joins with probability
   ``q = min(1, batch_size / n)``, independently (the batch may be empty);
2. computes each example's gradient of its own Orchestra loss (Opacus'
   per-sample gradient hooks), clips it to ``max_grad_norm`` and adds
   Gaussian noise of standard deviation ``noise_multiplier * max_grad_norm``
   to their sum (Opacus' ``DPOptimizer``, "secure mode" noise);
3. updates the online encoder and rotation head (SGD on the noisy mean),
   then the target encoder by EMA, which is post-processing.

Per-sample gradients are exact only if nothing in a step mixes examples:
the network must use GroupNorm (checked with Opacus' ``ModuleValidator``),
the cluster loss's targets are per-sample softmaxes, and the two online
passes (views 2 and 3) of one example add up in that example's gradient.

The amplification by subsampling that the accountant credits requires that
the server cannot tell which examples each batch held. The round's seed is
derived from values the server knows, so batch sampling and noise come from
the operating system's randomness instead (``secret_seed`` exists for
tests only). Augmentation randomness needs no secrecy and stays seeded.
"""

from __future__ import annotations

import secrets
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator

from privfed.data.augment import OrchestraViews, orchestra_views
from privfed.models.network import OrchestraNetwork, ema_update
from privfed.orchestra.local_training import LocalTrainingConfig, LocalTrainingResult, normalised_centroids, step_means
from privfed.orchestra.memory_sampling import poisson_memory, poisson_sample
from privfed.orchestra.objective import STEP_VALUES, StepLosses, augmentation_generator, orchestra_losses
from privfed.privacy.dp_sgd_plan import DpSgdSettings, round_events, sampling_rate, steps_per_round


class TrainedModules(nn.Module):
    """The modules DP-SGD updates (online encoder, rotation head), as one Opacus-wrappable module.

    Only used to install Opacus' hooks and to validate: the training step
    calls the network's own methods, which run these very modules.
    """

    def __init__(self, network: OrchestraNetwork) -> None:
        super().__init__()
        self.online = network.online
        self.rotation = network.rotation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.online(x)
        return z if self.rotation is None else self.rotation(z)


def check_private_network(network: OrchestraNetwork) -> None:
    """Refuses a network whose layers would make per-sample gradients wrong.

    Both encoders are checked: the target's outputs are the online encoder's
    training targets, so a BatchNorm there would mix examples too.
    """
    errors = ModuleValidator.validate(network, strict=False)
    if errors:
        raise ValueError(
            f"network cannot train with DP-SGD ({len(errors)} problems, e.g. {errors[0]}); "
            'build it with norm="group"'
        )


def secret_generators(device: torch.device, seed: int | None = None) -> tuple[torch.Generator, torch.Generator]:
    """CPU generator for batch sampling and one on ``device`` for the noise.

    Seeded from the operating system's randomness unless ``seed`` is given
    (tests only). Torch's generators are not cryptographic, but their seeds
    (63 bits each) never leave the client.
    """
    seeds = (secrets.randbits(63), secrets.randbits(63)) if seed is None else (seed, seed + 1)
    sampling = torch.Generator().manual_seed(seeds[0])
    noise = torch.Generator(device=device)
    noise.manual_seed(seeds[1])
    return sampling, noise


def dp_optimizer(
    network: OrchestraNetwork,
    config: LocalTrainingConfig,
    settings: DpSgdSettings,
    *,
    expected_batch_size: float,
    noise_generator: torch.Generator,
) -> DPOptimizer:
    """SGD with momentum and weight decay behind Opacus' clip-and-noise step.

    Weight decay and momentum act on the noisy gradient, so they are
    post-processing. ``loss_reduction="mean"`` divides the noisy sum by the
    *expected* batch size, as Poisson sampling requires. Only the parameters
    the objective trains are stepped: without the rotation loss the rotation
    head has no per-sample gradients (and so stays as it is).
    """
    optimizer = torch.optim.SGD(
        network.trainable_parameters(rotation=config.objective.rotation_loss),
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )
    return DPOptimizer(
        optimizer,
        noise_multiplier=settings.noise_multiplier,
        max_grad_norm=settings.max_grad_norm,
        expected_batch_size=expected_batch_size,
        loss_reduction="mean",
        generator=noise_generator,
        secure_mode=True,
    )


def set_empty_grad_samples(optimizer: DPOptimizer) -> None:
    """Per-sample gradients of an empty batch, so the step still adds noise.

    Skipping the step instead would reveal that the batch was empty, which
    depends on whether an example was sampled.
    """
    for p in optimizer.params:
        p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)


@contextmanager
def per_sample_gradients(network: OrchestraNetwork) -> Iterator[GradSampleModule]:
    """Opacus' per-sample gradient hooks on the online encoder and rotation head, removed on exit.

    While active, every backward pass through those modules leaves each
    parameter's per-example gradients in ``p.grad_sample`` (the two online
    passes of a step add up per example).
    """
    check_private_network(network)
    hooks = GradSampleModule(TrainedModules(network), batch_first=True, loss_reduction="mean", strict=True)
    try:
        with warnings.catch_warnings():
            # The stem's input needs no gradient; Opacus only uses the output gradients.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            yield hooks
    finally:
        hooks.cleanup()
        _drop_opacus_attributes(network)


def _drop_opacus_attributes(network: OrchestraNetwork) -> None:
    """Leaves the network as plain torch modules once the hooks are gone."""
    for p in network.trainable_parameters():
        for name in ("summed_grad", "grad_sample"):
            if hasattr(p, name):
                delattr(p, name)
        p.grad = None
    for module in network.modules():
        for name in ("activations", "max_batch_len"):
            if hasattr(module, name):
                delattr(module, name)


def dp_step(
    network: OrchestraNetwork,
    optimizer: DPOptimizer,
    views: OrchestraViews | None,
    centroids: torch.Tensor | None,
    config: LocalTrainingConfig,
) -> StepLosses | None:
    """One DP-SGD step on a batch's views (``None``: an empty batch), inside :func:`per_sample_gradients`.

    Clipping, noise and the SGD update happen in ``optimizer.step()``; the
    caller updates the target encoder afterwards.
    """
    optimizer.zero_grad(set_to_none=True)
    losses = None
    if views is None:
        set_empty_grad_samples(optimizer)
    else:
        losses = orchestra_losses(network, views, centroids, config.temperature, config.objective)
        losses.total.backward()
    optimizer.step()
    return losses


def train_with_dp_sgd(
    network: OrchestraNetwork,
    images: torch.Tensor,
    centroids: torch.Tensor | None,
    config: LocalTrainingConfig,
    *,
    generator: torch.Generator,
    device: torch.device,
    secret_seed: int | None = None,
) -> LocalTrainingResult:
    """One client's round of Orchestra under DP-SGD (see the module docstring).

    Args:
        network: Global network with GroupNorm, trained in place.
        images: ``[n, 3, H, W]`` uint8 images of this client.
        centroids: ``[G, D]`` global centroids, fixed during local training.
        config: Local hyperparameters; ``config.dp_sgd`` must be set.
        generator: The round's generator: augmentations and the memory sample.
        device: Where to train.
        secret_seed: Tests only: seeds batch sampling and noise.

    Returns:
        The result, with the memory of :func:`poisson_memory` and this
        round's DP-SGD cost as ``privacy_events``.
    """
    settings = config.dp_sgd
    if settings is None:
        raise ValueError("config.dp_sgd is not set")
    start = time.perf_counter()
    n = int(images.shape[0])
    rate = sampling_rate(n, config.batch_size)
    num_steps = steps_per_round(n, batch_size=config.batch_size, epochs=config.epochs)
    network.to(device).train()
    centroids = normalised_centroids(centroids, device)
    aug_generator = augmentation_generator(generator, device)
    sampling, noise = secret_generators(device, secret_seed)
    images = images.to(device)
    totals = torch.zeros(len(STEP_VALUES), device=device)
    nonempty = 0
    with per_sample_gradients(network):
        optimizer = dp_optimizer(network, config, settings, expected_batch_size=rate * n, noise_generator=noise)
        for _ in range(num_steps):
            index = poisson_sample(n, rate, sampling)
            views = orchestra_views(images[index.to(device)], generator=aug_generator) if index.numel() else None
            losses = dp_step(network, optimizer, views, centroids, config)
            assert network.target is not None  # DP-SGD trains only Orchestra (config refuses others), which has one
            ema_update(network.target, network.online, config.ema_decay)
            if losses is not None:
                totals += losses.detached()
                nonempty += 1
    memory, examples = poisson_memory(network, images, config, generator=generator, device=device)
    return LocalTrainingResult(
        memory=memory,
        memory_examples=examples,
        num_samples=n,
        num_steps=num_steps,
        step_means=step_means(totals, nonempty),
        seconds=time.perf_counter() - start,
        privacy_events=round_events(
            n, batch_size=config.batch_size, epochs=config.epochs, noise_multiplier=settings.noise_multiplier
        ),
    )
