"""The online/target encoder pair Orchestra trains and ships every round."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from privfed.errors import PrivfedError
from privfed.models.heads import projector, rotation_head
from privfed.models.resnet import BACKBONES


class Encoder(nn.Module):
    """Backbone followed by the projector."""

    def __init__(self, backbone: nn.Module, feature_dim: int, projection_dim: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = projector(feature_dim, projection_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.backbone(x))


class OrchestraNetwork(nn.Module):
    """Online encoder, its EMA target copy and the rotation head.

    The target encoder never receives gradients: its parameters have
    ``requires_grad=False`` and are only changed by :func:`ema_update`.
    """

    def __init__(self, backbone: str, projection_dim: int) -> None:
        super().__init__()
        if backbone not in BACKBONES:
            raise PrivfedError(f"unknown backbone {backbone!r} (choose from {', '.join(BACKBONES)})")
        net = BACKBONES[backbone]()
        self.online = Encoder(net, net.feature_dim, projection_dim)
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

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [*self.online.parameters(), *self.rotation.parameters()]


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, decay: float) -> None:
    """``target <- decay * target + (1 - decay) * online`` for the weights.

    BatchNorm running statistics are not averaged: the target runs its own
    forward passes in training mode (as in BYOL) and keeps its own statistics.
    """
    for t, o in zip(target.parameters(), online.parameters()):
        t.mul_(decay).add_(o.detach(), alpha=1.0 - decay)
