"""The heads on top of a backbone: projectors, the rotation head, the baselines' predictors."""

from __future__ import annotations

import torch.nn as nn

from privfed.models.norms import norm1d


def projector(in_dim: int, dim: int, *, hidden_dim: int, norm: str = "batch") -> nn.Sequential:
    """Two bias-free linear layers, ``in_dim -> hidden_dim -> dim``; the last normalisation has no affine part.

    Mirrors the paper's Linear-BN-ReLU-Linear-BN(affine=False); the final
    non-affine normalisation keeps the outputs centred, which helps the
    clustering loss avoid a collapsed solution. With ``norm="group"`` (DP-SGD)
    both normalisations work per sample (see :func:`norm1d`). RotPred,
    SimCLR and SpecLoss use the same shape in the authors' code.
    """
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


def rotation_head(dim: int) -> nn.Linear:
    """Predicts which of the four quarter turns was applied to a view."""
    return nn.Linear(dim, 4)
