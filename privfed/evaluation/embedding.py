"""A 2-D picture of representations coloured by class (t-SNE), for a person to see what the encoder separates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

#: t-SNE is quadratic in the points; a seeded subset of this many keeps it to seconds on a CPU.
MAX_POINTS = 2000
FIGURE_SIZE = (7.0, 6.0)  # inches
DPI = 100


def subset(num_points: int, *, limit: int = MAX_POINTS, seed: int = 0) -> np.ndarray:
    """Sorted indices of at most ``limit`` points, drawn without replacement with ``seed``."""
    if num_points <= limit:
        return np.arange(num_points)
    return np.sort(np.random.default_rng(seed).choice(num_points, size=limit, replace=False))


def tsne_2d(features: torch.Tensor, *, seed: int = 0) -> np.ndarray:
    """``[N, 2]`` t-SNE coordinates of L2-normalised features (the geometry the kNN monitor uses)."""
    from sklearn.manifold import TSNE

    points = torch.nn.functional.normalize(features.float(), dim=1).numpy()
    if points.shape[0] < 5:
        raise ValueError(f"t-SNE needs at least 5 points, got {points.shape[0]}")
    perplexity = min(30.0, (points.shape[0] - 1) / 3)
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(points)


def save_embedding_figure(
    points: np.ndarray, labels: np.ndarray, classes: tuple[str, ...], path: Path, *, title: str
) -> Path:
    """A scatter plot of ``points`` coloured by class, with the class names in a legend."""
    from privfed.extras import require

    require("matplotlib", feature="the t-SNE picture")

    import matplotlib

    # A Figure, not pyplot: drawing leaves the caller's backend (a notebook's) alone.
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGURE_SIZE)
    ax = fig.subplots()
    colours = matplotlib.colormaps["tab10" if len(classes) <= 10 else "tab20"]
    for index, name in enumerate(classes):
        mine = labels == index
        if mine.any():
            ax.scatter(points[mine, 0], points[mine, 1], s=6, color=colours(index % colours.N), label=name, alpha=0.8)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)
    if len(classes) <= 20:
        ax.legend(fontsize=7, markerscale=2, loc="best", frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path
