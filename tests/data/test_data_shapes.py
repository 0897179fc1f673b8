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


def _silhouette_features(images: np.ndarray) -> np.ndarray:
    """Colour-free descriptors of each object's silhouette (fill ratio, mass offsets, spread)."""
    img = images.astype(np.float32)
    corner = img[:, :2, :2].reshape(len(img), -1, 3).mean(axis=1)
    mask = np.abs(img - corner[:, None, None, :]).max(axis=-1) > 40
    feats = []
    ys, xs = np.mgrid[: img.shape[1], : img.shape[2]]
    for m in mask:
        yy, xx = ys[m], xs[m]
        if len(yy) < 5:
            feats.append(np.zeros(6))
            continue
        h, w = np.ptp(yy) + 1, np.ptp(xx) + 1
        cy, cx = (yy.mean() - yy.min()) / h, (xx.mean() - xx.min()) / w
        feats.append([len(yy) / (h * w), cy, cx, h / w, yy.std() / h, xx.std() / w])
    return np.asarray(feats)


def test_silhouette_predicts_class():
    # Counterpart of the colour test: colour-free silhouette descriptors separate
    # the classes far above chance (10 %), so shape carries the class signal.
    train, test = make_shapes(2000, seed=0), make_shapes(500, seed=1)
    f_train, f_test = _silhouette_features(train.images), _silhouette_features(test.images)
    mean, std = f_train.mean(0), f_train.std(0) + 1e-6
    f_train, f_test = (f_train - mean) / std, (f_test - mean) / std
    centroids = np.stack([f_train[train.labels == c].mean(0) for c in range(10)])
    predicted = np.argmin(((f_test[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (predicted == test.labels).mean() > 0.35


def test_a_quarter_turn_is_detectable():
    # Rotation prediction must be learnable: silhouettes tell an upright image
    # from the same image turned by 90 degrees well above chance (50 %).
    def upright_and_turned(data):
        turned = np.rot90(data.images, 1, axes=(1, 2))
        feats = np.concatenate([_silhouette_features(data.images), _silhouette_features(turned)])
        groups = np.concatenate([data.labels, data.labels + 10])  # class x orientation
        return feats, groups

    f_train, g_train = upright_and_turned(make_shapes(2000, seed=0))
    f_test, g_test = upright_and_turned(make_shapes(500, seed=1))
    mean, std = f_train.mean(0), f_train.std(0) + 1e-6
    f_train, f_test = (f_train - mean) / std, (f_test - mean) / std
    centroids = np.stack([f_train[g_train == g].mean(0) for g in range(20)])
    predicted = np.argmin(((f_test[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert ((predicted >= 10) == (g_test >= 10)).mean() > 0.7


def test_rejects_non_positive_size():
    with pytest.raises(ValueError):
        make_shapes(0, seed=0)
