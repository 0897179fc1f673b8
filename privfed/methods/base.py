"""The interface every training method implements: what it declares, and its step.

Only :meth:`Method.step` differs between methods; the local-training loop
(:func:`privfed.orchestra.client_update.train_locally`) and the rest of the
pipeline are shared, so their accuracies compare like for like.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from privfed.data.augment import view_draws
from privfed.models.heads import Heads
from privfed.models.network import OrchestraNetwork

#: Global centroids from clustering the clients' releases every round (Orchestra).
CLUSTERED = "clustered"
#: Global centroids drawn at random on the unit sphere once, then fixed; no releases.
FIXED_RANDOM = "fixed-random"
#: No centroids and no releases: the cluster loss is off.
NO_CENTROIDS = "none"
CENTROID_SOURCES = (CLUSTERED, FIXED_RANDOM, NO_CENTROIDS)

#: The per-step values a method may report (the names local training averages and clients may send).
STEP_VALUES = ("loss", "cluster_loss", "rotation_loss", "target_entropy", "centroid_cosine")


@dataclass(frozen=True)
class Batch:
    """One training batch as a step sees it: uint8 images on the training device, labels (for a method that reads
    them), L2-normalised global centroids (if any), the run's temperature, and the augmentations' generator."""

    images: torch.Tensor
    labels: torch.Tensor | None
    centroids: torch.Tensor | None
    temperature: float
    generator: torch.Generator


@dataclass(frozen=True)
class StepOutput:
    """A step's loss, its reported :data:`STEP_VALUES`, and the target representations to keep (None: none)."""

    loss: torch.Tensor
    values: dict[str, torch.Tensor]
    target_reps: torch.Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class Method(abc.ABC):
    """A named training method: its declarations and its step.

    Attributes:
        ema_targets: Its targets (and the representations it clusters) come from the EMA target encoder.
        couples_batch: One sample's loss depends on the rest of its batch, so DP-SGD is refused.
    """

    name: str
    description: str
    heads: Heads = Heads()
    centroids: str = NO_CENTROIDS
    ema_targets: bool = False
    reads_labels: bool = False
    couples_batch: bool = False

    def __post_init__(self) -> None:
        if self.centroids not in CENTROID_SOURCES:
            raise ValueError(f"unknown centroid source {self.centroids!r} (choose from {', '.join(CENTROID_SOURCES)})")
        if self.ema_targets and not self.heads.target:
            raise ValueError(f"method {self.name!r} takes EMA targets but declares no target encoder")

    @property
    def releases(self) -> bool:
        """Whether clients release anything about their representations (only to cluster them)."""
        return self.centroids == CLUSTERED

    @property
    def loss(self) -> str:
        """The loss it trains, as the summary names it (Orchestra's ablations share Orchestra's)."""
        return self.name

    @property
    def dp_sgd_refusal(self) -> str | None:
        """Why privfed's DP-SGD does not cover this method (None: it does)."""
        if self.couples_batch:
            return (f"method {self.name} cannot train with DP-SGD: it couples its batch (its loss compares every image with "
                    "the rest), so per-sample clipping does not bound one image's influence")
        if self.loss != "orchestra":
            return f"privfed's DP-SGD covers Orchestra and its ablations, not method {self.name}"
        return None

    @property
    def step_values(self) -> tuple[str, ...]:
        """The :data:`STEP_VALUES` its step reports."""
        return ("loss",)

    @property
    def untrained_heads(self) -> tuple[str, ...]:
        """Heads its network carries but its step never trains (DP-SGD steps only what is trained)."""
        return ()

    def step(self, network: OrchestraNetwork, batch: Batch) -> StepOutput:
        """One training step: by default :meth:`views_from` on one draw, then :meth:`step_on_views`, as a cohort
        computes it; a method without a :attr:`view_draw_count` overrides this."""
        count = self.view_draw_count
        if count is None:
            raise NotImplementedError(f"method {self.name} defines neither its step nor its views")
        draws = view_draws(batch.images.shape[0], count, generator=batch.generator)
        return self.step_on_views(network, self.views_from(batch.images, draws), batch.centroids, batch.temperature)

    @property
    def view_draw_count(self) -> int | None:
        """Uniform draws per image of its views; a method that declares it can train in a cohort
        (:mod:`privfed.orchestra.cohort_training`). None: one client at a time."""
        return None

    def views_from(self, images: torch.Tensor, draws: torch.Tensor) -> Any:
        """The views of uint8 ``images`` its step trains on, from ``[B, view_draw_count]`` uniforms (a pytree of tensors)."""
        raise NotImplementedError(f"method {self.name} does not train in a cohort")

    def step_on_views(self, network: OrchestraNetwork, views: Any, centroids: torch.Tensor | None, temperature: float) -> StepOutput:
        """The step on views already made: a function of tensors alone, so ``torch.func.vmap`` can batch it over clients."""
        raise NotImplementedError(f"method {self.name} does not train in a cohort")

    def encoder(self, network: OrchestraNetwork) -> nn.Module:
        """The encoder whose representations a client clusters: the EMA target, or the online encoder."""
        encoder = network.target if self.ema_targets else network.online
        assert encoder is not None  # __post_init__: EMA targets come with a target encoder
        return encoder

    @torch.no_grad()
    def representations(self, network: OrchestraNetwork, images: torch.Tensor) -> torch.Tensor:
        """L2-normalised representations of ``images`` that a client clusters (see :meth:`encoder`)."""
        return F.normalize(self.encoder(network)(images), dim=1)
