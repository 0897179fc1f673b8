"""The heads on top of a backbone (projectors, the rotation head, the baselines' predictors), and how a method declares them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn as nn

from privfed.models.norms import norm1d


def projector(in_dim: int, dim: int, *, hidden_dim: int, norm: str = "batch") -> nn.Sequential:
    """The paper's Linear-BN-ReLU-Linear-BN(affine=False), bias-free (also RotPred's, SimCLR's and SpecLoss's):
    the final normalisation keeps the outputs centred, which helps the clustering loss avoid collapse."""
    return nn.Sequential(
        nn.Linear(in_dim, hidden_dim, bias=False),
        norm1d(hidden_dim, norm),
        nn.ReLU(inplace=norm == "batch"),  # Opacus' backward hooks forbid in-place ops on hooked outputs
        nn.Linear(hidden_dim, dim, bias=False),
        norm1d(dim, norm, affine=False),
    )


def simsiam_projector(in_dim: int, dim: int, *, hidden_dim: int, norm: str = "batch") -> nn.Sequential:
    """SimSiam's three-layer projector: two Linear-BN-ReLU blocks, then Linear-BN(affine=False)."""
    return nn.Sequential(
        nn.Linear(in_dim, hidden_dim, bias=False),
        norm1d(hidden_dim, norm),
        nn.ReLU(),
        nn.Linear(hidden_dim, hidden_dim, bias=False),
        norm1d(hidden_dim, norm),
        nn.ReLU(),
        nn.Linear(hidden_dim, dim, bias=False),
        norm1d(dim, norm, affine=False),
    )


def mlp_head(in_dim: int, dim: int, *, hidden_dim: int, norm: str = "batch", bias: bool = True) -> nn.Sequential:
    """Linear-BN-ReLU-Linear without a final normalisation: BYOL's projector, and the predictors of SimSiam and BYOL."""
    return nn.Sequential(
        nn.Linear(in_dim, hidden_dim, bias=False),
        norm1d(hidden_dim, norm),
        nn.ReLU(),
        nn.Linear(hidden_dim, dim, bias=bias),
    )


@dataclass(frozen=True)
class HeadShape:
    """The sizes a head is built for: the backbone's feature width, D, the hidden width H, the run's counts."""

    features: int
    dim: int
    hidden: int
    norm: str
    num_clusters: int | None = None
    num_classes: int | None = None


HeadBuilder = Callable[[HeadShape], nn.Module]


def standard_projector(shape: HeadShape) -> nn.Module:
    return projector(shape.features, shape.dim, hidden_dim=shape.hidden, norm=shape.norm)


@dataclass(frozen=True)
class Heads:
    """What a method's network carries beside the backbone, as the method declares it and the network builds it.

    Attributes:
        target: An EMA copy of the online encoder.
        others: Named heads trained with the online encoder, built in this order (the names are state-dict prefixes).
        clusters, classes: A head is sized by ``HeadShape.num_clusters`` or ``num_classes``.
    """

    projector: HeadBuilder = standard_projector
    target: bool = False
    others: tuple[tuple[str, HeadBuilder], ...] = ()
    clusters: bool = False
    classes: bool = False


#: Orchestra's (and its ablations'): the projector, the EMA target and the rotation head (which of four quarter turns).
ORCHESTRA_HEADS = Heads(target=True, others=(("rotation", lambda shape: nn.Linear(shape.dim, 4)),))
