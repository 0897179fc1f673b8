"""The network a method trains and ships every round: Orchestra's online/target pair, or a baseline's."""

from __future__ import annotations

import copy
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from privfed.errors import PrivfedError
from privfed.methods import ORCHESTRA_LOSS, SUPERVISED_LOSS, get_method
from privfed.models.heads import mlp_head, projector, rotation_head, simsiam_projector
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
    """Online encoder, its EMA target copy and the rotation head; or a baseline's heads instead.

    The target encoder never receives gradients: its parameters have
    ``requires_grad=False`` and are only changed by :func:`ema_update`.

    ``norm="group"`` replaces every BatchNorm (backbone and projector, online
    and therefore target) by GroupNorm, which DP-SGD requires: see
    :mod:`privfed.models.norms`. The projector's hidden layer is
    ``projection_hidden_dim`` wide (default: the output dimension D; the
    authors' code uses 512).

    ``loss`` (a :class:`privfed.methods.Objective`'s) chooses the heads, with
    the shapes of the authors' code scaled to D and the hidden width H:
    Orchestra and its ablations have the target and the rotation head;
    SimSiam a three-layer projector and a predictor (H wide); BYOL an MLP
    projector and predictor (2H wide) and the target; SpecLoss a linear layer
    with ``num_clusters`` outputs after the normalised projection; SimCLR
    the projector alone; supervised FedAvg no projector, and a linear
    classifier with ``num_classes`` outputs on the backbone's features. A
    baseline's network holds only what its loss uses, so only that travels;
    Orchestra's ablations keep Orchestra's parts (e.g. ``rotpred`` ships a
    target encoder it moves only by EMA).
    """

    def __init__(
        self,
        backbone: str,
        projection_dim: int,
        *,
        projection_hidden_dim: int | None = None,
        norm: str = "batch",
        loss: str = ORCHESTRA_LOSS,
        num_clusters: int | None = None,
        num_classes: int | None = None,
    ) -> None:
        super().__init__()
        if backbone not in BACKBONES:
            raise PrivfedError(f"unknown backbone {backbone!r} (choose from {', '.join(BACKBONES)})")
        self.norm = check_norm(norm)
        self.projection_dim = projection_dim
        self.loss = loss
        net = BACKBONES[backbone](norm=norm)
        dim, hidden = projection_dim, projection_hidden_dim or projection_dim
        self.online = Encoder(net, _projector_for(loss, net.feature_dim, dim, hidden=hidden, norm=norm))
        self.target: Encoder | None = None
        if loss in (ORCHESTRA_LOSS, "byol"):
            self.target = copy.deepcopy(self.online)
            for p in self.target.parameters():
                p.requires_grad_(False)
        self.rotation = rotation_head(dim) if loss == ORCHESTRA_LOSS else None
        self.predictor: nn.Module | None = None
        if loss in ("simsiam", "byol"):
            self.predictor = mlp_head(dim, dim, hidden_dim=hidden if loss == "simsiam" else 2 * hidden, norm=norm)
        self.cluster_head: nn.Linear | None = None
        if loss == "specloss":
            if num_clusters is None:
                raise PrivfedError("SpecLoss's cluster head needs num_clusters (the run's number of global centroids)")
            self.cluster_head = nn.Linear(dim, num_clusters)
        self.classifier: nn.Linear | None = None
        if loss == SUPERVISED_LOSS:
            if num_classes is None:
                raise PrivfedError("supervised FedAvg's classifier needs num_classes")
            self.classifier = nn.Linear(net.feature_dim, num_classes)

    def online_embedding(self, x: torch.Tensor) -> torch.Tensor:
        """Unnormalised online projector output (fed to the rotation head)."""
        return self.online(x)

    @torch.no_grad()
    def target_representation(self, x: torch.Tensor) -> torch.Tensor:
        """L2-normalised target projector output: what clients cluster."""
        if self.target is None:
            raise PrivfedError(f"a {self.loss} network has no target encoder")
        return F.normalize(self.target(x), dim=1)

    def trainable_parameters(self, *, rotation: bool = True) -> list[nn.Parameter]:
        """Every parameter the method trains: the online encoder and the heads (the rotation head's unless ``rotation`` is False)."""
        heads = [self.predictor, self.cluster_head, self.classifier, self.rotation if rotation else None]
        return [*self.online.parameters(), *(p for head in heads if head is not None for p in head.parameters())]


def _projector_for(loss: str, in_dim: int, dim: int, *, hidden: int, norm: str) -> nn.Module:
    """The projector of the method whose loss is ``loss`` (none for supervised FedAvg: its head reads the backbone)."""
    if loss == "simsiam":
        return simsiam_projector(in_dim, dim, hidden_dim=hidden, norm=norm)
    if loss == "byol":
        return mlp_head(in_dim, dim, hidden_dim=2 * hidden, norm=norm, bias=False)
    if loss == SUPERVISED_LOSS:
        return nn.Identity()
    return projector(in_dim, dim, hidden_dim=hidden, norm=norm)


def network_norm(*, dp_sgd: bool) -> str:
    """The normalisation a run's network uses: GroupNorm exactly when clients train with DP-SGD."""
    return "group" if dp_sgd else "batch"


class NetworkSpec(Protocol):
    """What fixes the architecture: a run's :class:`~privfed.config.TrainConfig` or a client's configuration."""

    @property
    def method(self) -> str: ...
    @property
    def backbone(self) -> str: ...
    @property
    def projection_dim(self) -> int: ...
    @property
    def projection_hidden_dim(self) -> int | None: ...
    @property
    def cluster_head_outputs(self) -> int | None: ...
    @property
    def classifier_outputs(self) -> int | None: ...
    @property
    def dp_sgd(self) -> bool: ...


def build_network(config: NetworkSpec) -> OrchestraNetwork:
    """The run's network, as server, clients and checkpoint loading must all build it.

    The heads follow the method and the normalisation follows
    ``config.dp_sgd``, so a checkpoint always loads into the architecture its
    run's configuration describes.
    """
    return OrchestraNetwork(
        config.backbone,
        config.projection_dim,
        projection_hidden_dim=config.projection_hidden_dim,
        norm=network_norm(dp_sgd=config.dp_sgd),
        loss=get_method(config.method).objective.loss,
        num_clusters=config.cluster_head_outputs,
        num_classes=config.classifier_outputs,
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
