"""Normalisation layers: BatchNorm (the paper's) or GroupNorm (what DP-SGD needs).

BatchNorm normalises every sample with statistics of its whole batch, so one
example changes every other example's output and gradient: DP-SGD's
per-sample clipping would no longer bound one example's influence. GroupNorm
normalises each sample on its own and is what Opacus accepts, so a run with
``--dp-sgd`` builds every normalisation layer as a GroupNorm.

Module names are the same under both kinds, so a checkpoint loads into the
network its run's configuration describes (and fails loudly into the other).
"""

from __future__ import annotations

import torch.nn as nn

from privfed.errors import PrivfedError

NORMS = ("batch", "group")

#: Upper bound on the groups of a GroupNorm (the usual choice for ResNets).
MAX_GROUPS = 32
#: Lower bound on the channels per group: single-channel groups (instance
#: norm) discard each channel's contrast, which hurts small CIFAR ResNets.
MIN_CHANNELS_PER_GROUP = 4


def check_norm(norm: str) -> str:
    """``norm`` itself, or a :class:`PrivfedError` naming the valid choices."""
    if norm not in NORMS:
        raise PrivfedError(f"unknown normalisation {norm!r} (choose from {', '.join(NORMS)})")
    return norm


def group_count(channels: int) -> int:
    """Groups for ``channels``: the largest divisor of ``channels`` within the bounds above.

    16 channels get 4 groups, 32 get 8, 64 get 16, 128 and more get 32.
    """
    target = max(1, min(MAX_GROUPS, channels // MIN_CHANNELS_PER_GROUP))
    return next(g for g in range(target, 0, -1) if channels % g == 0)


def norm2d(channels: int, norm: str) -> nn.Module:
    """Normalisation after a convolution."""
    if check_norm(norm) == "batch":
        return nn.BatchNorm2d(channels)
    return nn.GroupNorm(group_count(channels), channels)


def norm1d(features: int, norm: str, *, affine: bool = True) -> nn.Module:
    """Normalisation of ``[B, features]`` vectors.

    The affine-free variant ends Orchestra's projector. Its GroupNorm form
    uses a single group: each output vector is centred and scaled across its
    own features (LayerNorm without parameters), the per-sample counterpart of
    BatchNorm centring each feature across the batch.
    """
    if check_norm(norm) == "batch":
        return nn.BatchNorm1d(features, affine=affine)
    groups = group_count(features) if affine else 1
    return nn.GroupNorm(groups, features, affine=affine)
