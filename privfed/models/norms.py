"""Normalisation layers: BatchNorm (the paper's) or GroupNorm (what DP-SGD needs).

BatchNorm lets one example change every other's output and gradient, which
per-sample clipping cannot bound, so ``--dp-sgd`` builds GroupNorms. Module names
are the same under both: a checkpoint loads into its run's network, and fails loudly into the other.
"""

from __future__ import annotations

import torch.nn as nn

from privfed.errors import PrivfedError

NORMS = ("batch", "group")

#: Upper bound on the groups of a GroupNorm (the usual choice for ResNets).
MAX_GROUPS = 32
#: Lower bound on the channels per group: single-channel groups discard each channel's contrast (small ResNets suffer).
MIN_CHANNELS_PER_GROUP = 4


def check_norm(norm: str) -> str:
    """``norm`` itself, or a :class:`PrivfedError` naming the valid choices."""
    if norm not in NORMS:
        raise PrivfedError(f"unknown normalisation {norm!r} (choose from {', '.join(NORMS)})")
    return norm


def group_count(channels: int) -> int:
    """The largest divisor of ``channels`` within the bounds above: 16 channels get 4 groups, 64 get 16, 128+ 32."""
    target = max(1, min(MAX_GROUPS, channels // MIN_CHANNELS_PER_GROUP))
    return next(g for g in range(target, 0, -1) if channels % g == 0)


def norm2d(channels: int, norm: str) -> nn.Module:
    """Normalisation after a convolution."""
    if check_norm(norm) == "batch":
        return nn.BatchNorm2d(channels)
    return nn.GroupNorm(group_count(channels), channels)


def norm1d(features: int, norm: str, *, affine: bool = True) -> nn.Module:
    """Normalisation of ``[B, features]`` vectors; the affine-free GroupNorm (ending Orchestra's projector) has one
    group, centring each vector across its own features, the per-sample counterpart of BatchNorm's centring."""
    if check_norm(norm) == "batch":
        return nn.BatchNorm1d(features, affine=affine)
    groups = group_count(features) if affine else 1
    return nn.GroupNorm(groups, features, affine=affine)
