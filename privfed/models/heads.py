"""Orchestra's projector and rotation-prediction head."""

from __future__ import annotations

import torch.nn as nn

from privfed.models.norms import norm1d


def projector(in_dim: int, dim: int, *, hidden_dim: int, norm: str = "batch") -> nn.Sequential:
    """Two bias-free linear layers, ``in_dim -> hidden_dim -> dim``; the last normalisation has no affine part.

    Mirrors the paper's Linear-BN-ReLU-Linear-BN(affine=False); the final
    non-affine normalisation keeps the outputs centred, which helps the
    clustering loss avoid a collapsed solution. With ``norm="group"`` (DP-SGD)
    both normalisations work per sample (see :func:`norm1d`).
    """
    return nn.Sequential(
        nn.Linear(in_dim, hidden_dim, bias=False),
        norm1d(hidden_dim, norm),
        nn.ReLU(inplace=norm == "batch"),  # Opacus' backward hooks forbid in-place ops on hooked outputs
        nn.Linear(hidden_dim, dim, bias=False),
        norm1d(dim, norm, affine=False),
    )


def rotation_head(dim: int) -> nn.Linear:
    """Predicts which of the four quarter turns was applied to a view."""
    return nn.Linear(dim, 4)
