"""The network a method trains and ships every round: a backbone with the heads its method declares."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from privfed.errors import PrivfedError
from privfed.models.heads import ORCHESTRA_HEADS, Heads, HeadShape
from privfed.models.norms import check_norm
from privfed.models.resnet import BACKBONES


class Encoder(nn.Module):
    """Backbone followed by the projector."""

    def __init__(self, backbone: nn.Module, projector: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = projector

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.backbone(x))


class OrchestraNetwork(nn.Module):
    """The online encoder and the heads a method declares (:class:`~privfed.models.heads.Heads`; Orchestra's by default).

    A declared target gets no gradients (:func:`ema_update` alone moves it); ``norm="group"`` replaces every
    BatchNorm (:mod:`privfed.models.norms`). The projector's hidden width defaults to D (the authors' code: 512).
    """

    def __init__(
        self,
        backbone: str,
        projection_dim: int,
        *,
        projection_hidden_dim: int | None = None,
        norm: str = "batch",
        heads: Heads = ORCHESTRA_HEADS,
        num_clusters: int | None = None,
        num_classes: int | None = None,
    ) -> None:
        super().__init__()
        if backbone not in BACKBONES:
            raise PrivfedError(f"unknown backbone {backbone!r} (choose from {', '.join(BACKBONES)})")
        self.norm = check_norm(norm)
        self.projection_dim = projection_dim
        net = BACKBONES[backbone](norm=norm)
        shape = HeadShape(net.feature_dim, projection_dim, projection_hidden_dim or projection_dim, norm, num_clusters, num_classes)
        self.online = Encoder(net, heads.projector(shape))
        self.target: Encoder | None = None
        if heads.target:
            self.target = copy.deepcopy(self.online)
            for p in self.target.parameters():
                p.requires_grad_(False)
        self.head_names = tuple(name for name, _ in heads.others)
        for name, build in heads.others:
            self.add_module(name, build(shape))

    def head(self, name: str) -> nn.Module:
        """The declared head called ``name``."""
        if name not in self.head_names:
            raise PrivfedError(f"this network has no {name} head (it has: {', '.join(self.head_names) or 'none'})")
        return self.get_submodule(name)

    def trainable_parameters(self, *, skip: tuple[str, ...] = ()) -> list[nn.Parameter]:
        """Every parameter the method trains: the online encoder's and the heads' (but those named in ``skip``)."""
        heads = [self.head(name) for name in self.head_names if name not in skip]
        return [*self.online.parameters(), *(p for head in heads for p in head.parameters())]


def network_norm(*, dp_sgd: bool) -> str:
    """The normalisation a run's network uses: GroupNorm exactly when clients train with DP-SGD."""
    return "group" if dp_sgd else "batch"


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, decay: float) -> None:
    """``target <- decay * target + (1 - decay) * online`` for the weights; the target keeps its own BatchNorm
    statistics, from its own forward passes in training mode (as in BYOL)."""
    ema_update_tensors(list(target.parameters()), list(online.parameters()), decay)


@torch.no_grad()
def ema_update_tensors(targets: list[torch.Tensor], onlines: list[torch.Tensor], decay: float) -> None:
    """:func:`ema_update` on tensor lists: two fused launches for every parameter, not two per parameter."""
    if len(targets) != len(onlines):
        raise ValueError(f"{len(targets)} target tensors for {len(onlines)} online ones")
    if not targets:
        return
    torch._foreach_mul_(targets, decay)
    torch._foreach_add_(targets, onlines, alpha=1.0 - decay)
