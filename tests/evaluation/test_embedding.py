"""The t-SNE picture: classes that are apart in feature space stay apart, and the PNG shows them."""

from __future__ import annotations

import numpy as np
import torch
from matplotlib.image import imread

from privfed.evaluation.embedding import DPI, FIGURE_SIZE, save_embedding_figure, subset, tsne_2d
from privfed.evaluation.knn import knn_accuracy


def three_clusters(n_per_class: int = 40, dim: int = 32) -> tuple[torch.Tensor, np.ndarray]:
    generator = torch.Generator().manual_seed(0)
    centres = torch.eye(dim)[:3] * 5
    features = torch.cat([c + 0.3 * torch.randn(n_per_class, dim, generator=generator) for c in centres])
    return features, np.repeat(np.arange(3), n_per_class)


def test_separated_classes_stay_separated_in_two_dimensions():
    features, labels = three_clusters()
    points = torch.as_tensor(tsne_2d(features, seed=0), dtype=torch.float32)
    assert points.shape == (120, 2)
    # A 5-NN vote in the picture recovers every class, as it does in feature space.
    labels_t = torch.as_tensor(labels)
    assert knn_accuracy(points, labels_t, points, labels_t, k=5, temperature=0.1) == 1.0
    assert np.allclose(tsne_2d(features, seed=0), tsne_2d(features, seed=0))  # seeded


def test_the_picture_has_its_size_and_every_class_in_its_colour(tmp_path):
    features, labels = three_clusters()
    path = save_embedding_figure(tsne_2d(features), labels, ("a", "b", "c"), tmp_path / "tsne.png", title="test")
    image = imread(path)[..., :3]
    assert image.shape[:2] == (int(FIGURE_SIZE[1] * DPI), int(FIGURE_SIZE[0] * DPI))
    tab10 = np.array([[0.122, 0.467, 0.706], [1.0, 0.498, 0.055], [0.173, 0.627, 0.173]])  # tab10's first three
    for colour in tab10:
        near = (np.abs(image - colour).max(axis=-1) < 0.1).sum()
        assert near > 50, colour


def test_a_subset_is_seeded_sorted_and_only_when_needed():
    assert np.array_equal(subset(10, limit=20), np.arange(10))
    picked = subset(5000, limit=100, seed=1)
    assert len(set(picked)) == 100 and np.all(np.diff(picked) > 0)
    assert np.array_equal(picked, subset(5000, limit=100, seed=1)) and not np.array_equal(picked, subset(5000, limit=100, seed=2))


def test_drawing_leaves_the_matplotlib_backend_alone(tmp_path):
    """A notebook's inline backend must survive the t-SNE picture (drawn on a Figure, not through pyplot)."""
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        features, labels = three_clusters(n_per_class=10)
        path = save_embedding_figure(tsne_2d(features), labels, ("a", "b", "c"), tmp_path / "tsne.png", title="test")
        assert matplotlib.get_backend() == "svg"
        assert np.std(imread(path)[..., :3]) > 0.05
    finally:
        matplotlib.use(before)
