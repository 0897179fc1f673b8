"""An embedded, procedurally generated 10-class image dataset ("shapes").

privfed must run with no network and no data files, so it ships a synthetic
dataset. It is built so that *shape* is the only class signal: foreground and
background colours are drawn independently of the class, and position, scale
and rotation vary. A randomly initialised CNN is dominated by colour and does
poorly on it, while an encoder trained with colour-jitter and crop
augmentations (as Orchestra does) learns the shapes, so the dataset shows
whether self-supervised training actually learned something.

Images are rendered at 2× resolution with hard masks and box-filtered down
(anti-aliasing), fully vectorised per class.
"""

from __future__ import annotations

import numpy as np

from privfed.data.arrays import ImageArrays

SHAPE_CLASSES: tuple[str, ...] = (
    "disc",
    "square",
    "triangle",
    "ring",
    "plus",
    "star",
    "horizontal_stripes",
    "vertical_stripes",
    "diagonal_stripes",
    "checkerboard",
)
IMAGE_SIZE = 32
_SUPERSAMPLE = 2  # _box_downsample assumes 2
_NOISE_STD = 0.03
_CHUNK = 512  # images rendered at once: bounds memory and stays cache-friendly


def make_shapes(num_images: int, *, seed: int) -> ImageArrays:
    """Generate ``num_images`` balanced shape images, deterministically per seed.

    Args:
        num_images: How many images (classes are balanced to within one).
        seed: Seed of the generator; the same seed gives identical arrays.

    Returns:
        An :class:`ImageArrays` named "shapes" with 32×32 RGB uint8 images.
    """
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
    """Draw every per-image random parameter up front (fixed order = determinism)."""
    scale = rng.uniform(7.0, 13.0, n)  # object radius in pixels
    margin = 0.6 * scale
    background = rng.uniform(0.0, 1.0, (n, 3))
    # Foreground = background shifted by 0.25–0.75 per channel (mod 1): it is
    # still uniformly distributed and independent of the class, but always
    # contrasts with the background in every channel. The offset law is
    # symmetric about 0.5, so foreground and background are exchangeable.
    foreground = np.mod(background + rng.uniform(0.25, 0.75, (n, 3)), 1.0)
    return {
        "cx": rng.uniform(margin, IMAGE_SIZE - margin),
        "cy": rng.uniform(margin, IMAGE_SIZE - margin),
        "scale": scale,
        "angle": rng.uniform(0.0, 2 * np.pi, n),
        "jitter": rng.uniform(-np.pi / 18, np.pi / 18, n),  # ±10° for oriented textures
        "diag_sign": np.where(rng.random(n) < 0.5, 1.0, -1.0),
        "period": rng.uniform(5.0, 9.0, n),  # stripe / checker period in pixels
        "phase": rng.uniform(0.0, 1.0, n),
        "background": background,
        "foreground": foreground,
        "gradient": rng.uniform(-0.15, 0.15, (n, 2)),
    }


def _render_mask(cls: int, p: dict[str, np.ndarray]) -> np.ndarray:
    """Render the anti-aliased foreground coverage (n×32×32, in [0,1]) of one class."""
    size = IMAGE_SIZE * _SUPERSAMPLE
    coords = (np.arange(size, dtype=np.float32) + 0.5) / _SUPERSAMPLE
    gx = coords[None, None, :]
    gy = coords[None, :, None]
    name = SHAPE_CLASSES[cls]
    if name.endswith("stripes") or name == "checkerboard":
        mask = _texture_mask(name, gx, gy, p)
    else:
        u, v = _local_coords(gx, gy, p)
        mask = _SHAPE_MASKS[name](u, v)
    return _box_downsample(mask)


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


def _disc(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return u * u + v * v <= 0.85**2


def _square(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(u), np.abs(v)) <= 0.72


def _triangle(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    # Equilateral triangle with circumradius 1: three half-planes at 120°.
    inside = np.ones(u.shape, dtype=bool)
    for k in range(3):
        theta = -np.pi / 2 + 2 * np.pi * k / 3
        inside &= u * np.cos(theta) + v * np.sin(theta) <= 0.5
    return inside


def _ring(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    r2 = u * u + v * v
    return (r2 <= 1.0) & (r2 >= 0.55**2)


def _plus(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    au, av = np.abs(u), np.abs(v)
    return ((au <= 0.28) & (av <= 1.0)) | ((av <= 0.28) & (au <= 1.0))


def _star(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    # Five-pointed star: radius oscillates between 0.4 (notches) and 1 (tips).
    phi = np.arctan2(v, u)
    t = np.mod(phi * (5 / (2 * np.pi)), 1.0)
    radius = 0.4 + 0.6 * np.abs(2 * t - 1)
    return u * u + v * v <= radius * radius


_SHAPE_MASKS = {
    "disc": _disc,
    "square": _square,
    "triangle": _triangle,
    "ring": _ring,
    "plus": _plus,
    "star": _star,
}


def _texture_mask(
    name: str, gx: np.ndarray, gy: np.ndarray, p: dict[str, np.ndarray]
) -> np.ndarray:
    """Whole-image periodic patterns; orientation is what tells stripes apart."""
    col = lambda a: a.astype(np.float32)[:, None, None]  # noqa: E731
    if name == "horizontal_stripes":
        angle = col(np.pi / 2 + p["jitter"])
    elif name == "vertical_stripes":
        angle = col(p["jitter"])
    elif name == "diagonal_stripes":
        angle = col(p["diag_sign"] * np.pi / 4 + p["jitter"])
    else:
        angle = col(p["angle"])
    along = np.cos(angle) * gx + np.sin(angle) * gy
    period, phase = col(p["period"]), col(p["phase"])
    stripe = np.mod(along / period + phase, 1.0) < 0.5
    if name != "checkerboard":
        return stripe
    across = np.cos(angle) * gy - np.sin(angle) * gx
    return stripe ^ (np.mod(across / period + phase, 1.0) < 0.5)


def _composite(alpha: np.ndarray, p: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Blend colours through the mask, add a lighting gradient and noise, quantise."""
    fg = p["foreground"].astype(np.float32)[:, None, None, :]
    bg = p["background"].astype(np.float32)[:, None, None, :]
    img = alpha[..., None] * (fg - bg)
    img += bg
    ramp = (np.arange(IMAGE_SIZE, dtype=np.float32) - (IMAGE_SIZE - 1) / 2) / IMAGE_SIZE
    grad = p["gradient"].astype(np.float32)
    light = (
        1.0
        + grad[:, 0, None, None] * ramp[None, None, :]
        + grad[:, 1, None, None] * ramp[None, :, None]
    )
    img *= light[..., None]
    # Uniform noise with standard deviation _NOISE_STD (much cheaper than Gaussian).
    noise = rng.random(img.shape, dtype=np.float32)
    noise -= 0.5
    noise *= np.float32(_NOISE_STD * np.sqrt(12.0))
    img += noise
    img *= 255.0
    img += 0.5  # round half up on the truncating cast below
    np.clip(img, 0.0, 255.0, out=img)
    return img.astype(np.uint8)
