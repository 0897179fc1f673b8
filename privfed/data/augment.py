"""Batched, per-sample-random image augmentations on tensors.

Orchestra needs three augmented views of every sample on every step; image by image through PIL that is the
bottleneck on a 2-core CPU. So every op transforms a whole B×3×H×W batch at once, a different draw per sample, on
the batch's device. Randomness comes only from the ``torch.Generator`` passed in (on the images' device): the same
state gives the same views. Images are float in [0, 1] until :func:`normalize`.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

NORM_MEAN = 0.5
NORM_STD = 0.25
# ITU-R BT.601 luma weights (what torchvision's rgb_to_grayscale uses).
_LUMA = (0.299, 0.587, 0.114)
# RGB → YIQ; hue turns in the (I, Q) plane. Float64 on the CPU, kept per device and dtype (MPS has no float64).
_RGB_TO_YIQ64 = torch.tensor(
    [[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]], dtype=torch.float64
)


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
    """uint8 images (0–255) as floats in [0, 1], in torch's default dtype, on their device."""
    if x_uint8.dtype != torch.uint8:
        raise ValueError(f"expected uint8 images, got {x_uint8.dtype}")
    return x_uint8.to(torch.get_default_dtype()).div_(255.0)


def normalize(x: torch.Tensor) -> torch.Tensor:
    """[0, 1] images at the encoders' input scale, ``(x - 0.5) / 0.25``; for training and evaluation alike."""
    return (x - NORM_MEAN) / NORM_STD


#: Uniform draws per sample each op consumes, in the order it reads them (one ``torch.rand`` call makes them all).
CROP_DRAWS, JITTER_DRAWS, GRAYSCALE_DRAWS, BLUR_DRAWS, SOLARIZE_DRAWS, ROTATION_DRAWS = 5, 5, 1, 2, 1, 1
#: Draws of one BYOL view: crop, jitter, greyscale, blur.
BYOL_VIEW_DRAWS = CROP_DRAWS + JITTER_DRAWS + GRAYSCALE_DRAWS + BLUR_DRAWS
#: Draws of :func:`orchestra_views`: view 1, view 2 (with solarisation), view 3 and its quarter turn.
ORCHESTRA_VIEW_DRAWS = 3 * BYOL_VIEW_DRAWS + SOLARIZE_DRAWS + ROTATION_DRAWS
#: Where each op's draws end within one BYOL view's.
_BYOL_VIEW_CUTS = tuple(itertools.accumulate((CROP_DRAWS, JITTER_DRAWS, GRAYSCALE_DRAWS, BLUR_DRAWS)))
#: Draws of :func:`two_views`: views 1 and 2.
TWO_VIEW_DRAWS = 2 * BYOL_VIEW_DRAWS + SOLARIZE_DRAWS


def view_draws(n: int, count: int, *, generator: torch.Generator) -> torch.Tensor:
    """``[n, count]`` uniforms in [0, 1) on the generator's device: every random choice of a batch's views.

    One draw instead of one per choice cuts the operators a step launches; clients trained together each draw from
    their own generator, and one transform serves all their images (:mod:`privfed.orchestra.cohort_training`).
    """
    return torch.rand(n, count, generator=generator, device=generator.device)


def random_resized_crop_flip(
    x: torch.Tensor,
    *,
    generator: torch.Generator,
    scale: tuple[float, float] = (0.2, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> torch.Tensor:
    """Crop a random box per sample, resize it back to H×W, and flip half the samples.

    The box covers a ``scale`` fraction of the image with aspect ``ratio`` (log-uniform), like torchvision's
    RandomResizedCrop, sides clamped to the image instead of resampled. One bicubic ``grid_sample`` per batch (the
    official code resizes bicubically), clamped back to [0, 1].
    """
    return _crop_flip(x, _draws(x, CROP_DRAWS, generator), scale=scale, ratio=ratio)


def _crop_flip(
    x: torch.Tensor, u: torch.Tensor, *, scale: tuple[float, float] = (0.2, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)
) -> torch.Tensor:
    n = x.shape[0]
    area = _scaled(u[:, 0], scale[0], scale[1], x)
    aspect = torch.exp(_scaled(u[:, 1], math.log(ratio[0]), math.log(ratio[1]), x))
    # Half-extents in normalised [-1, 1] coordinates equal the side fractions.
    half_w = torch.sqrt(area * aspect).clamp(max=1.0)
    half_h = torch.sqrt(area / aspect).clamp(max=1.0)
    cx = _scaled(u[:, 2], -1.0, 1.0, x) * (1.0 - half_w)
    cy = _scaled(u[:, 3], -1.0, 1.0, x) * (1.0 - half_h)
    flip = torch.where(u[:, 4] < 0.5, -1.0, 1.0).to(x.dtype)
    zero = torch.zeros_like(half_w)
    theta = torch.stack([half_w * flip, zero, cx, zero, half_h, cy], dim=1).view(n, 2, 3)
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

    Colour is a shortcut a self-supervised encoder must not rely on. Factors are uniform in [1 - s, 1 + s] (hue: a
    rotation of ±hue turns in YIQ space), applied in that order, clamped to [0, 1] after each.
    """
    u = _draws(x, JITTER_DRAWS, generator)
    return _jitter(x, u, brightness=brightness, contrast=contrast, saturation=saturation, hue=hue, p=p)


def _jitter(
    x: torch.Tensor, u: torch.Tensor, *, brightness: float = 0.4, contrast: float = 0.4, saturation: float = 0.2,
    hue: float = 0.1, p: float = 0.8,
) -> torch.Tensor:
    apply = u[:, 0] < p
    b = _per_sample(_scaled(u[:, 1], max(0.0, 1 - brightness), 1 + brightness, x))
    c = _per_sample(_scaled(u[:, 2], max(0.0, 1 - contrast), 1 + contrast, x))
    s = _per_sample(_scaled(u[:, 3], max(0.0, 1 - saturation), 1 + saturation, x))
    h = _scaled(u[:, 4], -hue, hue, x)
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
    return _grayscale(x, _draws(x, GRAYSCALE_DRAWS, generator), p=p)


def _grayscale(x: torch.Tensor, u: torch.Tensor, *, p: float = 0.2) -> torch.Tensor:
    return torch.where(_per_sample(u[:, 0] < p), _luma(x).expand_as(x), x)


def gaussian_blur(
    x: torch.Tensor, *, generator: torch.Generator, p: float, sigma: tuple[float, float] = (0.1, 2.0)
) -> torch.Tensor:
    """Blur a random fraction p of the samples with a 3×3 Gaussian (reflect padding, as the official code), its
    sigma uniform in ``sigma`` per sample: at 32×32 it softens edges without erasing the object."""
    return _blur(x, _draws(x, BLUR_DRAWS, generator), p=p, sigma=sigma)


def _blur(x: torch.Tensor, u: torch.Tensor, *, p: float, sigma: tuple[float, float] = (0.1, 2.0)) -> torch.Tensor:
    s = _scaled(u[:, 1], sigma[0], sigma[1], x)
    outer = torch.exp(-0.5 / s**2)  # weight of the taps at ±1 relative to the centre
    edge, centre = _per_sample(outer / (1 + 2 * outer)), _per_sample(1 / (1 + 2 * outer))
    padded = F.pad(x, (1, 1, 0, 0), mode="reflect")
    out = centre * x + edge * (padded[..., :-2] + padded[..., 2:])
    padded = F.pad(out, (0, 0, 1, 1), mode="reflect")
    out = centre * out + edge * (padded[..., :-2, :] + padded[..., 2:, :])
    return torch.where(_per_sample(u[:, 0] < p), out, x)


def solarize(
    x: torch.Tensor, *, generator: torch.Generator, p: float, threshold: float = 0.5
) -> torch.Tensor:
    """Invert pixels at or above ``threshold`` in a random fraction p of the samples."""
    return _solarize(x, _draws(x, SOLARIZE_DRAWS, generator), p=p, threshold=threshold)


def _solarize(x: torch.Tensor, u: torch.Tensor, *, p: float, threshold: float = 0.5) -> torch.Tensor:
    inverted = torch.where(x >= threshold, 1.0 - x, x)
    return torch.where(_per_sample(u[:, 0] < p), inverted, x)


def rotate_quarter_turns(
    x: torch.Tensor, *, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate each sample by k·90°, k uniform in 0..3, for the rotation-prediction head.

    Returns:
        (rotated images, k as int64); sample i is ``torch.rot90(x[i], k[i], dims=(-2, -1))``.
    """
    return _quarter_turns(x, _draws(x, ROTATION_DRAWS, generator))


def _quarter_turns(x: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"quarter-turn rotation needs square images, got {tuple(x.shape[-2:])}")
    k = (u[:, 0] * 4).long().clamp(max=3)
    out = x
    for turns in range(1, 4):  # select by mask: no data-dependent shapes, no GPU sync
        out = torch.where(_per_sample(k == turns), torch.rot90(x, turns, dims=(-2, -1)), out)
    return out, k


def orchestra_views(x_uint8: torch.Tensor, *, generator: torch.Generator) -> OrchestraViews:
    """Orchestra's three normalised views of a uint8 B×3×H×W batch, as the official ``OrchestraTransform``.

    view1: crop/flip, colour jitter (p 0.8), grayscale (p 0.2), blur (p 0.5).
    view2: the same with blur p 0.1, plus solarisation (p 0.2), drawn independently.
    view3: a third view-1 augmentation, then a random quarter turn (labels returned).
    """
    _check_generator(x_uint8, generator)
    return orchestra_views_from(x_uint8, view_draws(x_uint8.shape[0], ORCHESTRA_VIEW_DRAWS, generator=generator))


def orchestra_views_from(x_uint8: torch.Tensor, draws: torch.Tensor) -> OrchestraViews:
    """:func:`orchestra_views` with its random choices given: ``draws`` ``[B, ORCHESTRA_VIEW_DRAWS]`` uniforms."""
    x = to_float(x_uint8)
    _check_batch(x, None)
    view1, view2 = _byol_pair(x, draws[:, : 2 * BYOL_VIEW_DRAWS + SOLARIZE_DRAWS])
    rest = draws[:, 2 * BYOL_VIEW_DRAWS + SOLARIZE_DRAWS :]
    view3, labels = _quarter_turns(_byol_view(x, rest[:, :BYOL_VIEW_DRAWS]), rest[:, BYOL_VIEW_DRAWS:])
    return OrchestraViews(normalize(view1), normalize(view2), normalize(view3), labels)


def two_views(x_uint8: torch.Tensor, *, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The two normalised views the SSL baselines train on, drawn exactly as :func:`orchestra_views` draws its first
    two: every method sees the same augmentation of an image."""
    _check_generator(x_uint8, generator)
    return two_views_from(x_uint8, view_draws(x_uint8.shape[0], TWO_VIEW_DRAWS, generator=generator))


def two_views_from(x_uint8: torch.Tensor, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`two_views` with its random choices given: ``draws`` ``[B, TWO_VIEW_DRAWS]`` uniforms."""
    x = to_float(x_uint8)
    _check_batch(x, None)
    view1, view2 = _byol_pair(x, draws)
    return normalize(view1), normalize(view2)


def _byol_pair(x: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """View 1 and view 2 of float images from ``TWO_VIEW_DRAWS`` uniforms each."""
    return _byol_view(x, u[:, :BYOL_VIEW_DRAWS]), _byol_view(x, u[:, BYOL_VIEW_DRAWS:], blur_p=0.1, solarize_p=0.2)


def _byol_view(x: torch.Tensor, u: torch.Tensor, *, blur_p: float = 0.5, solarize_p: float = 0.0) -> torch.Tensor:
    """One BYOL-style view of float images; the defaults are the official view 1's."""
    cuts = _BYOL_VIEW_CUTS
    out = _crop_flip(x, u[:, : cuts[0]])
    out = _jitter(out, u[:, cuts[0] : cuts[1]])
    out = _grayscale(out, u[:, cuts[1] : cuts[2]])
    out = _blur(out, u[:, cuts[2] : cuts[3]], p=blur_p)
    if solarize_p > 0:
        out = _solarize(out, u[:, cuts[3] :], p=solarize_p)
    return out


def _check_batch(x: torch.Tensor, generator: torch.Generator | None) -> None:
    if x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"expected a B×3×H×W batch, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"expected float images in [0, 1], got {x.dtype}; use to_float() first")
    if generator is not None:
        _check_generator(x, generator)


def _check_generator(x: torch.Tensor, generator: torch.Generator) -> None:
    if generator.device.type != x.device.type:
        raise ValueError(
            f"generator is on {generator.device} but images are on {x.device}; "
            "create it with torch.Generator(device=x.device)"
        )


def _draws(x: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """``[B, count]`` uniforms for one op on its own, once the batch is checked."""
    _check_batch(x, generator)
    return view_draws(x.shape[0], count, generator=generator)


def _scaled(u: torch.Tensor, low: float, high: float, x: torch.Tensor) -> torch.Tensor:
    """Uniforms in [0, 1) mapped to [low, high), in x's dtype."""
    return (low + (high - low) * u).to(x.dtype)


def _per_sample(v: torch.Tensor) -> torch.Tensor:
    """A length-B vector, to broadcast over B×C×H×W."""
    return v.view(-1, 1, 1, 1)


def _luma(x: torch.Tensor) -> torch.Tensor:
    """Per-pixel luma, B×1×H×W."""
    r, g, b = _LUMA
    return r * x[:, 0:1] + g * x[:, 1:2] + b * x[:, 2:3]


def _rotate_hue(x: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Rotate each sample's chroma by ``turns`` of a full circle in YIQ space."""
    angle = 2 * math.pi * turns.to(torch.float32)
    fixed, by_cos, by_sin = _hue_rotation_parts(x.device, x.dtype)
    cos, sin = torch.cos(angle).to(x.dtype).view(-1, 1, 1), torch.sin(angle).to(x.dtype).view(-1, 1, 1)
    matrix = fixed + cos * by_cos + sin * by_sin
    return torch.einsum("bij,bjhw->bihw", matrix, x)


@functools.lru_cache(maxsize=8)
def _hue_rotation_parts(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """YIQ→RGB · R(θ) · RGB→YIQ as ``fixed + cos θ · by_cos + sin θ · by_sin``, once per device."""
    to_rgb, to_yiq = torch.linalg.inv(_RGB_TO_YIQ64), _RGB_TO_YIQ64
    luma_only = torch.diag(torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    chroma = torch.diag(torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64))
    turn = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    parts = (to_rgb @ luma_only @ to_yiq, to_rgb @ chroma @ to_yiq, to_rgb @ turn @ to_yiq)
    fixed, by_cos, by_sin = (part.to(device=device, dtype=dtype) for part in parts)
    return fixed, by_cos, by_sin
