"""Pieces ``ldp``, ``ldp-sums`` and ``ddp-sums`` share: defaults, clipping, the integer grid of noisy sums, padding."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: Default delta of a DP mechanism built on its own (privfed always passes the run's).
DEFAULT_DELTA = 1e-5
#: Default per-release epsilon of a DP mechanism built without a budget.
DEFAULT_EPSILON = 1.0
#: Widest representations a release takes; constructors check at this width that the samplers can draw the noise.
MAX_DIMENSION = 2**16
#: Room the server leaves above a client's size for the noise in a release's weights, in count-noise scales.
WEIGHT_NOISE_SCALES = 1000.0


@dataclass(frozen=True)
class Grid:
    """Integer grid for noisy sums.

    Points are rounded to multiples of ``step = r / resolution``. Rounding
    moves each coordinate by at most half a step, so one point's rounded
    vector has L2 norm at most ``resolution + sqrt(D)/2`` steps: the
    sensitivity the discrete Gaussian is scaled to.
    """

    step: float
    sensitivity: float

    @staticmethod
    def for_dimension(dim: int, radius: float, resolution: float | None = None) -> Grid:
        # 50 sqrt(D) steps per radius keeps the rounding overhead at 1% of the noise.
        res = resolution if resolution is not None else 50.0 * math.sqrt(max(dim, 1))
        return Grid(step=radius / res, sensitivity=res + math.sqrt(dim) / 2.0)


def clip_to_radius(x: torch.Tensor, radius: float) -> torch.Tensor:
    """Scales rows longer than ``radius`` back onto the ball (bounds sensitivity)."""
    norms = x.norm(dim=1, keepdim=True)
    return x * torch.clamp(radius / norms.clamp_min(1e-30), max=1.0)


def pad_centres(
    centres: torch.Tensor, weights: torch.Tensor, num_centroids: int, dim: int, *, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exactly ``num_centroids`` rows; padding rows have weight 0.

    Pads by repeating released centres (public already) or, when there are
    none, with random unit vectors from ``generator``: never with anything
    derived from raw representations.
    """
    have = centres.shape[0]
    if have >= num_centroids:
        return centres[:num_centroids], weights[:num_centroids]
    if have == 0:
        filler = F.normalize(torch.randn(num_centroids, dim, generator=generator, dtype=torch.float64), dim=1)
    else:
        filler = centres[torch.arange(num_centroids - have) % have]
    return (
        torch.cat([centres, filler[: num_centroids - have]]),
        torch.cat([weights, torch.zeros(num_centroids - have, dtype=weights.dtype)]),
    )
