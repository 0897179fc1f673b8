"""An embedded, procedurally generated 10-class image dataset ("shapes"), for runs with no network or data files.

*Shape* is the only class signal: grey levels (R = G = B) are drawn independently of the class, position and scale
vary. Every shape is upright (±15°) and none is symmetric under a quarter turn, so rotation prediction is learnable.
A random CNN, dominated by brightness and position, does poorly; an encoder Orchestra trained learns the shapes, so
the dataset shows whether self-supervised training learned something. Rendered at 2× with hard masks and
box-filtered down, vectorised per class.
"""

from __future__ import annotations

import numpy as np

from privfed.data.arrays import ImageArrays

SHAPE_CLASSES: tuple[str, ...] = (
    "triangle", "arrow", "letter_t", "letter_l", "house", "dome", "cup", "tree", "cross", "flag",
)
IMAGE_SIZE = 32
_SUPERSAMPLE = 2  # _box_downsample assumes 2
_NOISE_STD = 0.03
# Object radius in pixels: 24-30 px across in 32, so BYOL's crops (down to 20 % of the area) still show the silhouette.
_MIN_RADIUS = 12.0
_MAX_RADIUS = 15.0
_CHUNK = 512  # images rendered at once: bounds memory and stays cache-friendly


def make_shapes(num_images: int, *, seed: int) -> ImageArrays:
    """``num_images`` 32×32 shape images, classes balanced to within one; the same seed, the same arrays."""
    if num_images < 1:
        raise ValueError(f"num_images must be positive, got {num_images}")
    rng = np.random.default_rng(seed)
    n = num_images
    labels = rng.permutation(np.arange(n) % len(SHAPE_CLASSES)).astype(np.int64)
    params = _draw_params(rng, n)
    images = np.empty((n, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for cls in range(len(SHAPE_CLASSES)):
        members = np.flatnonzero(labels == cls)
        for start in range(0, len(members), _CHUNK):
            idx = members[start : start + _CHUNK]
            chunk = {k: v[idx] for k, v in params.items()}
            images[idx] = _composite(_render_mask(cls, chunk), chunk, rng)
    return ImageArrays(images, labels, SHAPE_CLASSES, "shapes")


def _draw_params(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Every per-image random parameter, drawn up front (fixed order = determinism)."""
    scale = rng.uniform(_MIN_RADIUS, _MAX_RADIUS, n)  # object radius in pixels
    margin = 0.6 * scale
    # Objects are lighter than their background, so a small CNN picks up silhouettes from a few thousand images.
    # Grey only: any per-image tint survives colour jitter and becomes what two views share, learnt instead of shape.
    background = np.repeat(rng.uniform(0.0, 0.4, (n, 1)), 3, axis=1)
    foreground = np.repeat(rng.uniform(0.6, 1.0, (n, 1)), 3, axis=1)
    return {
        "cx": rng.uniform(margin, IMAGE_SIZE - margin),
        "cy": rng.uniform(margin, IMAGE_SIZE - margin),
        "scale": scale,
        "angle": rng.uniform(-np.pi / 12, np.pi / 12, n),  # upright, ±15°
        "background": background,
        "foreground": foreground,
        "gradient": rng.uniform(-0.15, 0.15, (n, 2)),
    }


def _render_mask(cls: int, p: dict[str, np.ndarray]) -> np.ndarray:
    """The anti-aliased foreground coverage (n×32×32, in [0,1]) of one class."""
    size = IMAGE_SIZE * _SUPERSAMPLE
    coords = (np.arange(size, dtype=np.float32) + 0.5) / _SUPERSAMPLE
    gx = coords[None, None, :]
    gy = coords[None, :, None]
    u, v = _local_coords(gx, gy, p)
    return _box_downsample(_SHAPE_MASKS[cls](u, v))


def _box_downsample(mask: np.ndarray) -> np.ndarray:
    """Average each 2×2 block of a boolean mask (strided sums beat a reshape-mean)."""
    m = mask.view(np.uint8)
    total = m[:, 0::2, 0::2] + m[:, 1::2, 0::2] + m[:, 0::2, 1::2] + m[:, 1::2, 1::2]
    return total.astype(np.float32) * np.float32(0.25)


def _local_coords(
    gx: np.ndarray, gy: np.ndarray, p: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Map pixel coordinates into each object's rotated unit frame."""
    col = lambda a: a.astype(np.float32)[:, None, None]  # noqa: E731
    dx, dy = gx - col(p["cx"]), gy - col(p["cy"])
    cos, sin, inv = col(np.cos(p["angle"])), col(np.sin(p["angle"])), col(1.0 / p["scale"])
    return (cos * dx + sin * dy) * inv, (cos * dy - sin * dx) * inv


# Masks in each object's unit frame, about [-1, 1]^2: u points right, v points *down* ("up" is negative v).


def _triangle(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return (v >= -0.95) & (v <= 0.7) & (np.abs(u) <= 0.55 * (v + 0.95))


def _arrow(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    head = (v >= -0.95) & (v <= -0.1) & (np.abs(u) <= 1.0 * (v + 0.95))
    shaft = (np.abs(u) <= 0.22) & (v > -0.1) & (v <= 0.95)
    return head | shaft


def _letter_t(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    bar = (v >= -0.9) & (v <= -0.5) & (np.abs(u) <= 0.85)
    stem = (np.abs(u) <= 0.22) & (v > -0.5) & (v <= 0.9)
    return bar | stem


def _letter_l(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    upright = (u >= -0.7) & (u <= -0.3) & (np.abs(v) <= 0.9)
    foot = (v >= 0.5) & (v <= 0.9) & (u >= -0.7) & (u <= 0.7)
    return upright | foot


def _house(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    body = (np.abs(u) <= 0.6) & (v >= 0.0) & (v <= 0.9)
    roof = (v >= -0.9) & (v < 0.0) & (np.abs(u) <= 0.9 * (v + 0.9) / 0.9)
    return body | roof


def _dome(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return (u * u + (v - 0.45) ** 2 <= 0.95**2) & (v <= 0.45)


def _cup(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    outer = (np.abs(u) <= 0.8) & (np.abs(v) <= 0.8)
    inner = (np.abs(u) <= 0.42) & (v < 0.42)
    return outer & ~inner


def _tree(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    crown = u * u + (v + 0.35) ** 2 <= 0.62**2
    trunk = (np.abs(u) <= 0.16) & (v >= 0.2) & (v <= 0.95)
    return crown | trunk


def _cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    upright = (np.abs(u) <= 0.18) & (np.abs(v) <= 0.95)
    beam = (v >= -0.55) & (v <= -0.22) & (np.abs(u) <= 0.65)
    return upright | beam


def _flag(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    pole = (u >= -0.75) & (u <= -0.52) & (np.abs(v) <= 0.95)
    cloth = (u > -0.52) & (u <= 0.75) & (v >= -0.95) & (v <= -0.15)
    return pole | cloth


_SHAPE_MASKS = (_triangle, _arrow, _letter_t, _letter_l, _house, _dome, _cup, _tree, _cross, _flag)
assert tuple(mask.__name__[1:] for mask in _SHAPE_MASKS) == SHAPE_CLASSES


def _composite(alpha: np.ndarray, p: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Colours blended through the mask, with a lighting gradient and noise, quantised."""
    fg = p["foreground"].astype(np.float32)[:, None, None, :]
    bg = p["background"].astype(np.float32)[:, None, None, :]
    img = alpha[..., None] * (fg - bg)
    img += bg
    ramp = (np.arange(IMAGE_SIZE, dtype=np.float32) - (IMAGE_SIZE - 1) / 2) / IMAGE_SIZE
    grad = p["gradient"].astype(np.float32)
    light = 1.0 + grad[:, 0, None, None] * ramp[None, None, :] + grad[:, 1, None, None] * ramp[None, :, None]
    img *= light[..., None]
    # Uniform noise with standard deviation _NOISE_STD (much cheaper than Gaussian).
    noise = rng.random((*img.shape[:3], 1), dtype=np.float32)  # grey noise
    noise -= 0.5
    noise *= np.float32(_NOISE_STD * np.sqrt(12.0))
    img += noise
    img *= 255.0
    img += 0.5  # round half up on the truncating cast below
    np.clip(img, 0.0, 255.0, out=img)
    return img.astype(np.uint8)
