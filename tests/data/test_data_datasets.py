"""Tests for dataset specs (load_dataset) and their descriptions."""

import numpy as np
import pytest

from privfed.data.datasets import DATASET_NAMES, describe_datasets, evaluation_splits, load_dataset
from privfed.errors import PrivfedError


def test_unknown_spec_lists_valid_names(tmp_path):
    with pytest.raises(PrivfedError) as err:
        load_dataset("mnist", split="train", data_dir=tmp_path)
    message = str(err.value)
    assert "mnist" in message
    for name in ("shapes", "cifar10", "cifar100", "arrays:PATH"):
        assert name in message


@pytest.mark.parametrize(
    ("spec", "folder"), [("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python")]
)
def test_cifar_missing_dir_does_not_download(tmp_path, spec, folder):
    with pytest.raises(PrivfedError) as err:
        load_dataset(spec, split="train", data_dir=tmp_path, download=False)
    message = str(err.value)
    assert str(tmp_path / folder) in message
    assert "--download" in message
    assert "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_shapes_default_and_sized(tmp_path):
    small = load_dataset("shapes:200", split="train", data_dir=tmp_path)
    assert len(small) == 200 and small.name == "shapes" and len(small.classes) == 10
    test = load_dataset("shapes", split="test", data_dir=tmp_path)
    assert len(test) == 1000
    # The train set is a prefix-independent draw from a fixed seed: same spec, same data.
    again = load_dataset("shapes:200", split="train", data_dir=tmp_path)
    np.testing.assert_array_equal(small.images, again.images)
    assert not np.array_equal(small.images, test.images[:200])


@pytest.mark.parametrize("spec", ["shapes:abc", "shapes:0", "shapes:-5", "shapes:"])
def test_bad_shapes_size(tmp_path, spec):
    with pytest.raises(PrivfedError, match="shapes:N"):
        load_dataset(spec, split="train", data_dir=tmp_path)


def test_arrays_spec(tmp_path):
    path = tmp_path / "own.npz"
    np.savez(path, x=np.zeros((10, 8, 8, 3), dtype=np.uint8), y=np.arange(10) % 2)
    assert len(load_dataset(f"arrays:{path}", split="train", data_dir=tmp_path)) == 8
    assert len(load_dataset(f"arrays:{path}", split="test", data_dir=tmp_path)) == 2


def test_arrays_spec_needs_path(tmp_path):
    with pytest.raises(PrivfedError, match="arrays:PATH"):
        load_dataset("arrays:", split="train", data_dir=tmp_path)


def test_arrays_spec_missing_file(tmp_path):
    with pytest.raises(PrivfedError, match="not found"):
        load_dataset(f"arrays:{tmp_path / 'missing.npz'}", split="train", data_dir=tmp_path)


def test_bad_split(tmp_path):
    with pytest.raises(PrivfedError, match="split"):
        load_dataset("shapes", split="validation", data_dir=tmp_path)  # type: ignore[arg-type]


def test_describe_datasets_one_line_each():
    described = describe_datasets()
    assert tuple(described) == DATASET_NAMES
    assert all(text and "\n" not in text for text in described.values())


def write_images(path, n, *, with_test=False):
    rng = np.random.default_rng(n)
    arrays = {"x": rng.integers(0, 255, (n, 8, 8, 3), dtype=np.uint8), "y": rng.integers(0, 3, n)}
    if with_test:
        arrays.update(x_test=arrays["x"][:4], y_test=arrays["y"][:4])
    np.savez(path, **arrays)
    return f"arrays:{path}"


def test_a_file_named_only_for_testing_is_scored_whole(tmp_path):
    train, test = write_images(tmp_path / "a.npz", 40), write_images(tmp_path / "b.npz", 25)
    assert evaluation_splits(train, test) == ("all", "all")
    assert len(load_dataset(test, split="all", data_dir=tmp_path)) == 25


def test_the_same_file_or_a_builtin_dataset_keeps_its_split(tmp_path):
    spec = write_images(tmp_path / "a.npz", 40)
    same = f"arrays:{tmp_path}/./a.npz"  # another spelling of the same file
    assert evaluation_splits(spec, same) == ("train", "test")
    assert evaluation_splits("shapes:1000", "shapes:1000") == ("train", "test")
    assert evaluation_splits("cifar10", spec) == ("train", "all")


def test_a_file_with_its_own_test_arrays_keeps_them(tmp_path):
    train, test = write_images(tmp_path / "a.npz", 40), write_images(tmp_path / "b.npz", 25, with_test=True)
    assert evaluation_splits(train, test) == ("all", "test")
    assert len(load_dataset(test, split="test", data_dir=tmp_path)) == 4


def test_only_an_arrays_file_can_be_used_whole(tmp_path):
    with pytest.raises(PrivfedError, match="only an arrays:PATH file"):
        load_dataset("shapes:100", split="all", data_dir=tmp_path)
