"""The DP-SGD parts of the local-training loop (:func:`privfed.orchestra.client_update.train_locally`), with Opacus.

Each of a round's Poisson steps (each example joins with ``q = min(1, batch_size / n)``)
clips each example's gradient to ``max_grad_norm`` and adds Gaussian noise of
std ``noise_multiplier * max_grad_norm`` to their sum (Opacus, secure mode);
the target's EMA is post-processing. Per-sample gradients are exact only with
a GroupNorm network, a method that does not couple its batch, and an
example's online passes adding up in its own gradient. The amplification the
accountant credits needs batches the server cannot know, so sampling and
noise use the OS's randomness (tests replace this module's ``secrets``).
"""

from __future__ import annotations

import functools
import secrets
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator

from mechanisms.base import PrivacyEvent
from privfed.methods import Method
from privfed.models.network import OrchestraNetwork
from privfed.orchestra.local_training import LocalTrainingConfig, TrainingParts
from privfed.orchestra.memory_sampling import poisson_memory, poisson_sample
from privfed.privacy.dp_sgd_plan import DpSgdSettings, round_events, sampling_rate, steps_per_round


def dp_optimizer(
    hooks: GradSampleModule,
    config: LocalTrainingConfig,
    settings: DpSgdSettings,
    *,
    expected_batch_size: float,
    noise_generator: torch.Generator,
) -> DPOptimizer:
    """SGD behind Opacus' clip-and-noise step on ``hooks``' parameters; weight decay and momentum act on the noisy
    gradient (post-processing), whose sum is divided by the *expected* batch size, as Poisson sampling requires."""
    optimizer = torch.optim.SGD(
        list(hooks.parameters()),
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


@contextmanager
def per_sample_gradients(network: OrchestraNetwork, method: Method) -> Iterator[GradSampleModule]:
    """Opacus' per-sample gradient hooks (``p.grad_sample``) on the online encoder and the heads the method
    trains, removed on exit; an untrained head gets none, and so no step."""
    # Both encoders: the target's outputs are the online encoder's targets, so a BatchNorm there would mix examples too.
    errors = ModuleValidator.validate(network, strict=False)
    if errors:
        raise ValueError(f'network cannot train with DP-SGD ({len(errors)} problems, e.g. {errors[0]}); build it with norm="group"')
    # The modules DP-SGD updates, as one module for Opacus (the step calls the network's own modules).
    trained = {"online": network.online} | {h: network.head(h) for h in network.head_names if h not in method.untrained_heads}
    hooks = GradSampleModule(nn.ModuleDict(trained), batch_first=True, loss_reduction="mean", strict=True)
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


def dp_step(optimizer: DPOptimizer, loss: torch.Tensor | None) -> None:
    """One DP-SGD step on a batch's loss (None: an empty batch), inside :func:`per_sample_gradients`."""
    optimizer.zero_grad(set_to_none=True)
    if loss is None:
        # Empty per-sample gradients, so the step still adds noise: skipping it would reveal the empty batch.
        for p in optimizer.params:
            p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
    else:
        loss.backward()
    optimizer.step()


@contextmanager
def dp_sgd_parts(
    network: OrchestraNetwork, n: int, config: LocalTrainingConfig, method: Method, *, device: torch.device
) -> Iterator[TrainingParts]:
    """The round's secret Poisson batches and the clip-and-noise step (an empty batch still steps: noise alone).

    Seeded from the OS: torch's generators are not cryptographic, but the 63-bit seeds never leave the client.
    """
    assert config.dp_sgd is not None
    if method.dp_sgd_refusal:  # the configuration refuses it too; a library caller of the loop must not get DP-SGD events
        raise ValueError(method.dp_sgd_refusal)
    rate = sampling_rate(n, config.batch_size)
    sampling, noise = torch.Generator().manual_seed(secrets.randbits(63)), torch.Generator(device=device)
    noise.manual_seed(secrets.randbits(63))
    with per_sample_gradients(network, method) as hooks:
        optimizer = dp_optimizer(hooks, config, config.dp_sgd, expected_batch_size=rate * n, noise_generator=noise)
        num_steps = steps_per_round(n, batch_size=config.batch_size, epochs=config.epochs)
        yield (poisson_sample(n, rate, sampling) for _ in range(num_steps)), functools.partial(dp_step, optimizer)


def private_memory_and_cost(
    network: OrchestraNetwork, images: torch.Tensor, config: LocalTrainingConfig, *, generator: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, tuple[PrivacyEvent, ...]]:
    """After a round: the memory, a Poisson sample (not the last batches, whose membership is secret), and the round's cost."""
    assert config.dp_sgd is not None
    memory, examples = poisson_memory(network, images, config, generator=generator, device=device)
    n, noise = int(images.shape[0]), config.dp_sgd.noise_multiplier
    return memory, examples, round_events(n, batch_size=config.batch_size, epochs=config.epochs, noise_multiplier=noise)
