"""Tests for the embedded procedural shapes dataset."""

import numpy as np
import pytest

from privfed.data.shapes import SHAPE_CLASSES, make_shapes


def test_shape_dtype_and_classes():
    data = make_shapes(50, seed=0)
    assert data.images.shape == (50, 32, 32, 3) and data.images.dtype == np.uint8
    assert data.labels.dtype == np.int64
    assert data.classes == SHAPE_CLASSES and len(data.classes) == 10
    assert data.name == "shapes"


def test_deterministic_per_seed():
    a, b, c = make_shapes(300, seed=3), make_shapes(300, seed=3), make_shapes(300, seed=4)
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert not np.array_equal(a.images, c.images)


def test_classes_balanced():
    counts = np.bincount(make_shapes(1003, seed=0).labels, minlength=10)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 1003


def test_every_image_has_visible_foreground():
    images = make_shapes(1000, seed=0).images.astype(np.float32)
    contrast = images.reshape(len(images), -1, 3).std(axis=1).max(axis=1)
    assert contrast.min() > 10.0


def _mean_rgb(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), -1, 3).mean(axis=1)


def test_colour_alone_does_not_predict_class():
    train, test = make_shapes(3000, seed=0), make_shapes(2000, seed=1)
    features = _mean_rgb(train.images)
    centroids = np.stack([features[train.labels == c].mean(axis=0) for c in range(10)])
    dist = ((_mean_rgb(test.images)[:, None, :] - centroids[None]) ** 2).sum(axis=-1)
    accuracy = (dist.argmin(axis=1) == test.labels).mean()
    assert accuracy < 0.16  # chance is 0.10


def test_shape_does_predict_class():
    # Counterpart of the colour test: a colour-free feature (the fraction of
    # pixels whose brightness changes sharply, i.e. edge density) separates
    # textures from compact shapes far above chance.
    data = make_shapes(2000, seed=0)
    gray = data.images.astype(np.float32).mean(axis=-1)
    edges = (np.abs(np.diff(gray, axis=1)) > 20).mean(axis=(1, 2))
    edges += (np.abs(np.diff(gray, axis=2)) > 20).mean(axis=(1, 2))
    textures = np.isin(data.labels, [6, 7, 8, 9])  # 40 % of the images
    threshold = np.quantile(edges, 0.6)
    accuracy = ((edges > threshold) == textures).mean()
    assert accuracy > 0.8


def test_rejects_non_positive_size():
    with pytest.raises(ValueError):
        make_shapes(0, seed=0)
