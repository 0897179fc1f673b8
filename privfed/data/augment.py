"""Batched, per-sample-random image augmentations on tensors.

Orchestra needs three augmented views of every sample on every step. Doing
that image by image through PIL is the bottleneck on a 2-core CPU, so every
op here transforms a whole B×3×H×W batch at once with a different random draw
per sample, and runs on whatever device the batch lives on (GPU included).

Randomness comes only from the ``torch.Generator`` passed in, which must live
on the same device as the images (``torch.Generator(device=x.device)``): the
same generator state always gives the same views, on any run.

Images are float in [0, 1] until :func:`normalize`, which maps them to the
fixed per-channel scale the encoders see, ``(x - 0.5) / 0.25``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

NORM_MEAN = 0.5
NORM_STD = 0.25
# ITU-R BT.601 luma weights (what torchvision's rgb_to_grayscale uses).
_LUMA = (0.299, 0.587, 0.114)
# RGB → YIQ; hue is rotated in the (I, Q) chroma plane.
_RGB_TO_YIQ64 = torch.tensor(
    [[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]], dtype=torch.float64
)
# Kept in float32: some accelerators (e.g. Apple MPS) have no float64.
_RGB_TO_YIQ = _RGB_TO_YIQ64.to(torch.float32)
_YIQ_TO_RGB = torch.linalg.inv(_RGB_TO_YIQ64).to(torch.float32)


@dataclass(eq=False)
class OrchestraViews:
    """The three views Orchestra trains on (DESIGN §4), already normalised.

    Attributes:
        view1: BYOL view 1 (target-encoder input for the clustering loss).
        view2: BYOL view 2, with solarisation (online-encoder input).
        view3: A third view-1 augmentation, rotated by ``rotation_labels`` quarter turns.
        rotation_labels: int64 in 0..3, targets of the rotation head.
    """

    view1: torch.Tensor
    view2: torch.Tensor
    view3: torch.Tensor
    rotation_labels: torch.Tensor


def to_float(x_uint8: torch.Tensor) -> torch.Tensor:
    """Convert uint8 images (0–255) to float32 in [0, 1], keeping the device."""
    if x_uint8.dtype != torch.uint8:
        raise ValueError(f"expected uint8 images, got {x_uint8.dtype}")
    return x_uint8.to(torch.float32).div_(255.0)


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Map [0, 1] images to the encoders' input scale; use for training and evaluation alike."""
    return (x - NORM_MEAN) / NORM_STD


def random_resized_crop_flip(
    x: torch.Tensor,
    *,
    generator: torch.Generator,
    scale: tuple[float, float] = (0.2, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> torch.Tensor:
    """Crop a random box per sample, resize it back to H×W, and flip half the samples.

    The box covers a ``scale`` fraction of the image with aspect ``ratio``
    (log-uniform), like torchvision's RandomResizedCrop; sides are clamped to
    the image instead of resampled. One affine grid per sample does crop,
    resize and horizontal flip in a single bicubic ``grid_sample`` (the
    official code resizes bicubically), clamped back to [0, 1].
    """
    _check_batch(x, generator)
    n = x.shape[0]
    area = _uniform(n, scale[0], scale[1], x, generator)
    log_ratio = _uniform(n, math.log(ratio[0]), math.log(ratio[1]), x, generator)
    aspect = torch.exp(log_ratio)
    # Half-extents in normalised [-1, 1] coordinates equal the side fractions.
    half_w = torch.sqrt(area * aspect).clamp(max=1.0)
    half_h = torch.sqrt(area / aspect).clamp(max=1.0)
    cx = _uniform(n, -1.0, 1.0, x, generator) * (1.0 - half_w)
    cy = _uniform(n, -1.0, 1.0, x, generator) * (1.0 - half_h)
    flip = torch.where(_uniform(n, 0.0, 1.0, x, generator) < 0.5, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3, device=x.device, dtype=x.dtype)
    theta[:, 0, 0] = half_w * flip
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = half_h
    theta[:, 1, 2] = cy
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    out = F.grid_sample(x, grid, mode="bicubic", padding_mode="border", align_corners=False)
    return out.clamp(0.0, 1.0)  # bicubic overshoots at edges


def color_jitter(
    x: torch.Tensor,
    *,
    generator: torch.Generator,
    brightness: float = 0.4,
    contrast: float = 0.4,
    saturation: float = 0.2,
    hue: float = 0.1,
    p: float = 0.8,
) -> torch.Tensor:
    """Randomly change brightness, contrast, saturation and hue, per sample, with probability p.

    Colour is a shortcut a self-supervised encoder must not rely on; jitter
    removes it. Factors are uniform in [1 - s, 1 + s] (hue: a rotation of
    ±hue turns in YIQ space), applied in that fixed order and clamped to
    [0, 1] after each step.
    """
    _check_batch(x, generator)
    n = x.shape[0]
    apply = _uniform(n, 0.0, 1.0, x, generator) < p
    b = _per_sample(_uniform(n, max(0.0, 1 - brightness), 1 + brightness, x, generator))
    c = _per_sample(_uniform(n, max(0.0, 1 - contrast), 1 + contrast, x, generator))
    s = _per_sample(_uniform(n, max(0.0, 1 - saturation), 1 + saturation, x, generator))
    h = _uniform(n, -hue, hue, x, generator)
    out = (x * b).clamp(0.0, 1.0)
    mean = _luma(out).mean(dim=(1, 2, 3), keepdim=True)
    out = ((out - mean) * c + mean).clamp(0.0, 1.0)
    gray = _luma(out)
    out = ((out - gray) * s + gray).clamp(0.0, 1.0)
    out = _rotate_hue(out, h).clamp(0.0, 1.0)
    return torch.where(_per_sample(apply), out, x)


def random_grayscale(
    x: torch.Tensor, *, generator: torch.Generator, p: float = 0.2
) -> torch.Tensor:
    """Replace a random fraction p of the samples by their luma, on all three channels."""
    _check_batch(x, generator)
    apply = _uniform(x.shape[0], 0.0, 1.0, x, generator) < p
    return torch.where(_per_sample(apply), _luma(x).expand_as(x), x)


def gaussian_blur(
    x: torch.Tensor, *, generator: torch.Generator, p: float, sigma: tuple[float, float] = (0.1, 2.0)
) -> torch.Tensor:
    """Blur a random fraction p of the samples with a 3×3 Gaussian, its sigma uniform in ``sigma`` per sample.

    The official code's kernel (3×3, reflect padding): at 32×32 a 3×3 kernel
    softens edges without erasing the object. Separable, so two 3-tap passes.
    """
    _check_batch(x, generator)
    n = x.shape[0]
    apply = _uniform(n, 0.0, 1.0, x, generator) < p
    s = _uniform(n, sigma[0], sigma[1], x, generator)
    outer = torch.exp(-0.5 / s**2)  # weight of the taps at ±1 relative to the centre
    edge, centre = _per_sample(outer / (1 + 2 * outer)), _per_sample(1 / (1 + 2 * outer))
    padded = F.pad(x, (1, 1, 0, 0), mode="reflect")
    out = centre * x + edge * (padded[..., :-2] + padded[..., 2:])
    padded = F.pad(out, (0, 0, 1, 1), mode="reflect")
    out = centre * out + edge * (padded[..., :-2, :] + padded[..., 2:, :])
    return torch.where(_per_sample(apply), out, x)


def solarize(
    x: torch.Tensor, *, generator: torch.Generator, p: float, threshold: float = 0.5
) -> torch.Tensor:
    """Invert pixels at or above ``threshold`` in a random fraction p of the samples."""
    _check_batch(x, generator)
    apply = _uniform(x.shape[0], 0.0, 1.0, x, generator) < p
    inverted = torch.where(x >= threshold, 1.0 - x, x)
    return torch.where(_per_sample(apply), inverted, x)


def rotate_quarter_turns(
    x: torch.Tensor, *, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate each sample by k·90°, k uniform in 0..3, for the rotation-prediction head.

    Returns:
        (rotated images, k as int64). Sample i equals
        ``torch.rot90(x[i], k[i], dims=(-2, -1))`` (counter-clockwise turns).
    """
    _check_batch(x, generator)
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"quarter-turn rotation needs square images, got {tuple(x.shape[-2:])}")
    k = torch.randint(0, 4, (x.shape[0],), generator=generator, device=x.device)
    out = x
    for turns in range(1, 4):  # select by mask: no data-dependent shapes, no GPU sync
        out = torch.where(_per_sample(k == turns), torch.rot90(x, turns, dims=(-2, -1)), out)
    return out, k


def orchestra_views(x_uint8: torch.Tensor, *, generator: torch.Generator) -> OrchestraViews:
    """Make Orchestra's three normalised views of a uint8 B×3×H×W batch.

    As the official ``OrchestraTransform``:
    view1: crop/flip, colour jitter (p 0.8), grayscale (p 0.2), blur (p 0.5).
    view2: the same with blur p 0.1, plus solarisation (p 0.2), drawn independently.
    view3: a third view-1 augmentation, then a random quarter turn (labels returned).
    The generator must be on the batch's device.
    """
    x = to_float(x_uint8)
    view1, view2 = _byol_pair(x, generator)
    view3, labels = rotate_quarter_turns(_byol_view(x, generator), generator=generator)
    return OrchestraViews(normalize(view1), normalize(view2), normalize(view3), labels)


def two_views(x_uint8: torch.Tensor, *, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The two normalised BYOL-style views the SSL baselines train on: Orchestra's view 1 and view 2.

    They are drawn exactly as :func:`orchestra_views` draws its first two
    views, so every method sees the same augmentation of an image.
    """
    view1, view2 = _byol_pair(to_float(x_uint8), generator)
    return normalize(view1), normalize(view2)


def _byol_pair(x: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """View 1 and view 2 of float images, in that order of draws."""
    return _byol_view(x, generator), _byol_view(x, generator, blur_p=0.1, solarize_p=0.2)


def _byol_view(
    x: torch.Tensor, generator: torch.Generator, *, blur_p: float = 0.5, solarize_p: float = 0.0
) -> torch.Tensor:
    """One BYOL-style view of float images; the defaults are the official view 1's."""
    out = random_resized_crop_flip(x, generator=generator)
    out = color_jitter(out, generator=generator)
    out = random_grayscale(out, generator=generator, p=0.2)
    out = gaussian_blur(out, generator=generator, p=blur_p)
    if solarize_p > 0:
        out = solarize(out, generator=generator, p=solarize_p)
    return out


def _check_batch(x: torch.Tensor, generator: torch.Generator) -> None:
    """Reject inputs the batched ops cannot handle, with a clear message."""
    if x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"expected a B×3×H×W batch, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"expected float images in [0, 1], got {x.dtype}; use to_float() first")
    if generator.device.type != x.device.type:
        raise ValueError(
            f"generator is on {generator.device} but images are on {x.device}; "
            "create it with torch.Generator(device=x.device)"
        )


def _uniform(
    n: int, low: float, high: float, x: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Draw n uniforms in [low, high) on x's device, in x's dtype."""
    u = torch.rand(n, generator=generator, device=x.device)
    return (low + (high - low) * u).to(x.dtype)


def _per_sample(v: torch.Tensor) -> torch.Tensor:
    """Reshape a length-B vector to broadcast over B×C×H×W."""
    return v.view(-1, 1, 1, 1)


def _luma(x: torch.Tensor) -> torch.Tensor:
    """Per-pixel luma, B×1×H×W."""
    r, g, b = _LUMA
    return r * x[:, 0:1] + g * x[:, 1:2] + b * x[:, 2:3]


def _rotate_hue(x: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Rotate each sample's chroma by ``turns`` of a full circle in YIQ space."""
    angle = 2 * math.pi * turns.to(torch.float32)
    cos, sin = torch.cos(angle), torch.sin(angle)
    rot = torch.zeros(x.shape[0], 3, 3, dtype=torch.float32, device=x.device)
    rot[:, 0, 0] = 1.0
    rot[:, 1, 1], rot[:, 1, 2] = cos, -sin
    rot[:, 2, 1], rot[:, 2, 2] = sin, cos
    to_yiq = _RGB_TO_YIQ.to(x.device)
    to_rgb = _YIQ_TO_RGB.to(x.device)
    matrix = (to_rgb @ rot @ to_yiq).to(x.dtype)
    return torch.einsum("bij,bjhw->bihw", matrix, x)
