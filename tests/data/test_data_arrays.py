"""Tests for ImageArrays and the .npz image-arrays loader."""

from pathlib import Path

import numpy as np
import pytest
import torch

from privfed.data.arrays import ImageArrays, load_npz
from privfed.errors import PrivfedError


def _write(tmp_path: Path, name: str = "data.npz", **arrays: np.ndarray) -> Path:
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def _indexed_images(n: int) -> np.ndarray:
    """Images whose first pixel stores their index, so splits can be traced back."""
    x = np.zeros((n, 4, 5, 3), dtype=np.uint8)
    x[:, 0, 0, 0] = np.arange(n)
    return x


def test_happy_path_all_split(tmp_path):
    x = _indexed_images(10)
    y = np.arange(10) % 3
    path = _write(tmp_path, "mine.npz", x=x, y=y, classes=np.array(["a", "b", "c"]))
    data = load_npz(path, split="all")
    assert len(data) == 10
    assert data.images.dtype == np.uint8 and data.images.shape == (10, 4, 5, 3)
    assert data.labels.dtype == np.int64
    np.testing.assert_array_equal(data.labels, y)
    assert data.classes == ("a", "b", "c")
    assert data.name == "mine"


def test_default_class_names(tmp_path):
    path = _write(tmp_path, x=_indexed_images(4), y=np.array([0, 3, 1, 3]))
    assert load_npz(path, split="all").classes == ("0", "1", "2", "3")


def test_subset_and_to_tensor(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (6, 4, 5, 3), dtype=np.uint8)
    data = ImageArrays(x, np.arange(6, dtype=np.int64), tuple("abcdef"), "t")
    sub = data.subset(np.array([4, 1]))
    np.testing.assert_array_equal(sub.labels, [4, 1])
    assert sub.classes == data.classes and sub.name == "t"
    tensor = data.to_tensor()
    assert tensor.dtype == torch.uint8 and tensor.shape == (6, 3, 4, 5)
    assert tensor.is_contiguous()
    np.testing.assert_array_equal(tensor.numpy(), x.transpose(0, 3, 1, 2))


def test_train_test_split_is_fixed_disjoint_and_complete(tmp_path):
    n = 101
    path = _write(tmp_path, x=_indexed_images(n), y=np.zeros(n, dtype=np.int64))
    train = load_npz(path, split="train").images[:, 0, 0, 0]
    test = load_npz(path, split="test").images[:, 0, 0, 0]
    assert len(train) == 81 and len(test) == 20
    assert not set(train.tolist()) & set(test.tolist())
    assert sorted(train.tolist() + test.tolist()) == list(range(n))
    np.testing.assert_array_equal(train, load_npz(path, split="train").images[:, 0, 0, 0])
    # A fixed seeded shuffle, not simply the first 80 %.
    assert set(test.tolist()) != set(range(81, n))


def test_explicit_test_arrays_are_used(tmp_path):
    path = _write(
        tmp_path,
        x=_indexed_images(8),
        y=np.zeros(8, dtype=np.int64),
        x_test=_indexed_images(3),
        y_test=np.array([1, 2, 4]),
    )
    assert len(load_npz(path, split="train")) == 8
    test = load_npz(path, split="test")
    np.testing.assert_array_equal(test.labels, [1, 2, 4])
    assert len(test.classes) == len(load_npz(path, split="train").classes) == 5
    assert len(load_npz(path, split="all")) == 11


def test_missing_file(tmp_path):
    with pytest.raises(PrivfedError, match="not found"):
        load_npz(tmp_path / "nope.npz", split="all")


def test_not_an_npz(tmp_path):
    path = tmp_path / "junk.npz"
    path.write_text("hello, not a zip")
    with pytest.raises(PrivfedError, match=r"not a valid \.npz"):
        load_npz(path, split="all")


def test_single_npy_is_rejected(tmp_path):
    path = tmp_path / "single.npy"
    np.save(path, _indexed_images(2))
    with pytest.raises(PrivfedError, match=r"not a valid \.npz"):
        load_npz(path, split="all")


@pytest.mark.parametrize("missing", ["x", "y"])
def test_missing_array_is_named(tmp_path, missing):
    arrays = {"x": _indexed_images(3), "y": np.zeros(3, dtype=np.int64)}
    del arrays[missing]
    path = _write(tmp_path, **arrays)
    with pytest.raises(PrivfedError, match=f"no '{missing}' array"):
        load_npz(path, split="all")


def test_wrong_dtype(tmp_path):
    path = _write(
        tmp_path, x=np.zeros((3, 4, 4, 3), dtype=np.float32), y=np.zeros(3, dtype=np.int64)
    )
    with pytest.raises(PrivfedError, match="uint8"):
        load_npz(path, split="all")


@pytest.mark.parametrize("shape", [(3, 4, 4), (3, 4, 4, 1), (3, 4, 4, 3, 1)])
def test_wrong_shape(tmp_path, shape):
    path = _write(tmp_path, x=np.zeros(shape, dtype=np.uint8), y=np.zeros(3, dtype=np.int64))
    with pytest.raises(PrivfedError, match=r"N×H×W×3"):
        load_npz(path, split="all")


def test_float_labels_rejected(tmp_path):
    path = _write(tmp_path, x=_indexed_images(3), y=np.zeros(3, dtype=np.float64))
    with pytest.raises(PrivfedError, match="integer"):
        load_npz(path, split="all")


def test_mismatched_lengths(tmp_path):
    path = _write(tmp_path, x=_indexed_images(10), y=np.zeros(9, dtype=np.int64))
    with pytest.raises(PrivfedError, match="x has 10 images but y has 9 labels"):
        load_npz(path, split="all")


def test_negative_labels(tmp_path):
    path = _write(tmp_path, x=_indexed_images(3), y=np.array([0, -1, 2]))
    with pytest.raises(PrivfedError, match="negative"):
        load_npz(path, split="all")


def test_too_few_class_names(tmp_path):
    path = _write(
        tmp_path, x=_indexed_images(3), y=np.array([0, 1, 2]), classes=np.array(["a", "b"])
    )
    with pytest.raises(PrivfedError, match="classes"):
        load_npz(path, split="all")


def test_object_arrays_rejected(tmp_path):
    classes = np.array(["a", 1], dtype=object)
    path = _write(tmp_path, x=_indexed_images(2), y=np.array([0, 1]), classes=classes)
    with pytest.raises(PrivfedError, match="Python objects"):
        load_npz(path, split="all")


@pytest.mark.parametrize("labels", [[0, 1, 10_000_000], [0, 3, 1]])
def test_labels_beyond_the_number_of_images_are_refused(tmp_path, labels):
    """One stray label of 1e7 made 10,000,001 classes (4.3 GB for 300 images)."""
    path = _write(tmp_path, x=_indexed_images(3), y=np.array(labels))
    with pytest.raises(PrivfedError, match=r"class indices 0\.\.C-1 with C at most the 3 images"):
        load_npz(path, split="all")


def test_test_images_of_another_size_are_warned_about_not_refused(tmp_path):
    from privfed.config import build_config
    from privfed.run.plan import plan_run

    images = np.random.default_rng(0).integers(0, 255, size=(60, 8, 8, 3), dtype=np.uint8)
    spec = f"arrays:{_write(tmp_path, x=images, y=np.arange(60) % 3)}"
    config = build_config(dataset="shapes:300", test_dataset=spec, num_clients=4, participation=1.0,
                          num_global_centroids=8, out=str(tmp_path / "run"))
    (warning,) = plan_run(config).warnings
    assert f"the test ({spec}) images are 8×8×3 but the training (shapes:300) images are 32×32×3" in warning
    assert plan_run(config.replace(test_dataset="shapes")).warnings == ()
