"""The online/target encoder pair Orchestra trains and ships every round."""

from __future__ import annotations

import copy
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from privfed.errors import PrivfedError
from privfed.models.heads import projector, rotation_head
from privfed.models.norms import check_norm
from privfed.models.resnet import BACKBONES


class Encoder(nn.Module):
    """Backbone followed by the projector."""

    def __init__(
        self, backbone: nn.Module, feature_dim: int, projection_dim: int, *, hidden_dim: int, norm: str = "batch"
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = projector(feature_dim, projection_dim, hidden_dim=hidden_dim, norm=norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.backbone(x))


class OrchestraNetwork(nn.Module):
    """Online encoder, its EMA target copy and the rotation head.

    The target encoder never receives gradients: its parameters have
    ``requires_grad=False`` and are only changed by :func:`ema_update`.

    ``norm="group"`` replaces every BatchNorm (backbone and projector, online
    and therefore target) by GroupNorm, which DP-SGD requires: see
    :mod:`privfed.models.norms`. The projector's hidden layer is
    ``projection_hidden_dim`` wide (default: the output dimension D; the
    authors' code uses 512).
    """

    def __init__(
        self,
        backbone: str,
        projection_dim: int,
        *,
        projection_hidden_dim: int | None = None,
        norm: str = "batch",
    ) -> None:
        super().__init__()
        if backbone not in BACKBONES:
            raise PrivfedError(f"unknown backbone {backbone!r} (choose from {', '.join(BACKBONES)})")
        self.norm = check_norm(norm)
        self.projection_dim = projection_dim
        net = BACKBONES[backbone](norm=norm)
        hidden = projection_hidden_dim or projection_dim
        self.online = Encoder(net, net.feature_dim, projection_dim, hidden_dim=hidden, norm=norm)
        self.target = copy.deepcopy(self.online)
        for p in self.target.parameters():
            p.requires_grad_(False)
        self.rotation = rotation_head(projection_dim)

    def online_embedding(self, x: torch.Tensor) -> torch.Tensor:
        """Unnormalised online projector output (fed to the rotation head)."""
        return self.online(x)

    @torch.no_grad()
    def target_representation(self, x: torch.Tensor) -> torch.Tensor:
        """L2-normalised target projector output: what clients cluster."""
        return F.normalize(self.target(x), dim=1)

    def trainable_parameters(self, *, rotation: bool = True) -> list[nn.Parameter]:
        """The online encoder's parameters, and the rotation head's unless ``rotation`` is False."""
        return [*self.online.parameters(), *(self.rotation.parameters() if rotation else ())]


def network_norm(*, dp_sgd: bool) -> str:
    """The normalisation a run's network uses: GroupNorm exactly when clients train with DP-SGD."""
    return "group" if dp_sgd else "batch"


class NetworkSpec(Protocol):
    """What fixes the architecture: a run's :class:`~privfed.config.TrainConfig` or a client's configuration."""

    backbone: str
    projection_dim: int
    projection_hidden_dim: int | None
    dp_sgd: bool


def build_network(config: NetworkSpec) -> OrchestraNetwork:
    """The run's network, as server, clients and checkpoint loading must all build it.

    The normalisation follows ``config.dp_sgd``, so a checkpoint always loads
    into the architecture its run's configuration describes.
    """
    return OrchestraNetwork(
        config.backbone,
        config.projection_dim,
        projection_hidden_dim=config.projection_hidden_dim,
        norm=network_norm(dp_sgd=config.dp_sgd),
    )


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, decay: float) -> None:
    """``target <- decay * target + (1 - decay) * online`` for the weights.

    BatchNorm running statistics are not averaged: the target runs its own
    forward passes in training mode (as in BYOL) and keeps its own statistics.
    GroupNorm has none.
    """
    for t, o in zip(target.parameters(), online.parameters()):
        t.mul_(decay).add_(o.detach(), alpha=1.0 - decay)
