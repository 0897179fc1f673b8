"""Orchestra's projector and rotation-prediction head."""

from __future__ import annotations

import torch.nn as nn


def projector(in_dim: int, dim: int) -> nn.Sequential:
    """Two bias-free linear layers; the last BatchNorm has no affine part.

    Mirrors the paper's Linear-BN-ReLU-Linear-BN(affine=False); the final
    non-affine BatchNorm keeps the outputs centred, which helps the clustering
    loss avoid a collapsed solution.
    """
    return nn.Sequential(
        nn.Linear(in_dim, dim, bias=False),
        nn.BatchNorm1d(dim),
        nn.ReLU(inplace=True),
        nn.Linear(dim, dim, bias=False),
        nn.BatchNorm1d(dim, affine=False),
    )


def rotation_head(dim: int) -> nn.Linear:
    """Predicts which of the four quarter turns was applied to a view."""
    return nn.Linear(dim, 4)
