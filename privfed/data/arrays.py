"""In-memory image datasets and the ``.npz`` image-arrays loader.

Every dataset (shapes, CIFAR, user arrays) ends up as one :class:`ImageArrays` of uint8 images and int64 labels,
so partitioning, training and evaluation share one code path, and slicing per client is cheap.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from privfed.errors import PrivfedError

#: Seed of the fixed train/test split of files without a test set (not a run option: every command sees one split).
SPLIT_SEED = 20220717
#: Fraction of samples that goes to "train" when a file has no test set.
TRAIN_FRACTION = 0.8

Split = Literal["train", "test", "all"]


@dataclass(frozen=True, eq=False)  # arrays have no single truth value: compare by identity
class ImageArrays:
    """A labelled image dataset: uint8 N×H×W×3 ``images`` (channels last), int64 ``labels``, a name per class."""

    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    name: str

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: np.ndarray) -> ImageArrays:
        """The samples at ``indices``, e.g. one client's share of a partition."""
        idx = np.asarray(indices, dtype=np.int64)
        return ImageArrays(self.images[idx], self.labels[idx], self.classes, self.name)

    def to_tensor(self) -> torch.Tensor:
        """The images as a contiguous uint8 N×C×H×W tensor (4× smaller than float until a batch is augmented)."""
        return torch.from_numpy(np.ascontiguousarray(self.images)).permute(0, 3, 1, 2).contiguous()


def load_npz(path: Path, *, split: Split) -> ImageArrays:
    """An image-arrays ``.npz`` file (docs/usage.md, "Data"); without ``x_test``, a fixed seeded 80/20 split.

    ``split``: "train", "test", or "all" (every sample). PrivfedError when the file is missing or malformed.
    """
    path = Path(path)
    if split not in ("train", "test", "all"):
        raise PrivfedError(f"unknown split {split!r}: expected 'train', 'test' or 'all'")
    arrays = _read_npz(path)
    x, y = _checked_pair(arrays, "x", "y", path)
    test_pair = None
    if "x_test" in arrays or "y_test" in arrays:
        test_pair = _checked_pair(arrays, "x_test", "y_test", path)
        if test_pair[0].shape[1:] != x.shape[1:]:
            raise PrivfedError(
                f"{path}: x_test images are {_hwc(test_pair[0])} but x images are {_hwc(x)}"
            )
    all_labels = y if test_pair is None else np.concatenate([y, test_pair[1]])
    classes = _class_names(arrays.get("classes"), all_labels, path)
    x, y = _select_split(x, y, test_pair, split)
    return ImageArrays(x, y, classes, path.stem)


def size_mismatch(train: ImageArrays, test: ImageArrays, *, train_name: str, test_name: str) -> str | None:
    """A warning when two datasets' images differ in size (the encoder runs on both, but compares unlike images)."""
    if train.images.shape[1:] == test.images.shape[1:]:
        return None
    return f"the {test_name} images are {_hwc(test.images)} but the {train_name} images are {_hwc(train.images)}"


def has_test_arrays(path: Path) -> bool:
    """Whether an ``.npz`` holds its own test split (``x_test``); False for a file that cannot be read,
    which :func:`load_npz` then reports."""
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return "x_test" in arrays.files
    except Exception:
        return False


def split_indices(num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed, sorted, disjoint (train, test) indices of all samples, for a file without a test set."""
    order = np.random.default_rng(SPLIT_SEED).permutation(num_samples)
    num_train = round(TRAIN_FRACTION * num_samples)
    return np.sort(order[:num_train]), np.sort(order[num_train:])


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an npz file, I/O problems as user errors."""
    if not path.exists():
        raise PrivfedError(
            f"image-arrays file not found: {path}; give an existing .npz (--dataset arrays:PATH), "
            "or use CIFAR-10 itself: --dataset cifar10 --download"
        )
    if not path.is_file():
        raise PrivfedError(f"image-arrays path is not a file: {path}")
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise PrivfedError(f"{path} is not a valid .npz file ({type(err).__name__})") from err
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise PrivfedError(f"{path} is not a valid .npz file (it holds a single .npy array)")
    with data:
        try:
            return {key: data[key] for key in data.files}
        except ValueError as err:
            raise PrivfedError(
                f"{path} stores Python objects (pickled arrays); save plain numeric or "
                "string arrays instead"
            ) from err
        except (OSError, EOFError, zipfile.BadZipFile) as err:
            raise PrivfedError(f"{path} is not a valid .npz file (corrupt member: {err})") from err


def _checked_pair(
    arrays: dict[str, np.ndarray], x_key: str, y_key: str, path: Path
) -> tuple[np.ndarray, np.ndarray]:
    """One checked (images, labels) pair as (uint8, int64) arrays."""
    for key in (x_key, y_key):
        if key not in arrays:
            found = ", ".join(sorted(arrays)) or "none"
            raise PrivfedError(f"{path} has no '{key}' array (found: {found})")
    x, y = arrays[x_key], arrays[y_key]
    if x.dtype != np.uint8:
        raise PrivfedError(f"{path}: '{x_key}' must be uint8 images, got dtype {x.dtype}")
    if x.ndim != 4 or x.shape[-1] != 3:
        raise PrivfedError(
            f"{path}: '{x_key}' must have shape N×H×W×3 (RGB, channels last), got {x.shape}"
        )
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise PrivfedError(
            f"{path}: '{y_key}' must be a 1-D integer array, got dtype {y.dtype} shape {y.shape}"
        )
    if x.shape[0] != y.shape[0]:
        raise PrivfedError(
            f"{path}: {x_key} has {x.shape[0]} images but {y_key} has {y.shape[0]} labels"
        )
    if x.shape[0] == 0:
        raise PrivfedError(f"{path}: '{x_key}' holds no images")
    if (y < 0).any():
        raise PrivfedError(f"{path}: '{y_key}' has negative labels (min {int(y.min())})")
    return x, y.astype(np.int64)


def _class_names(stored: np.ndarray | None, labels: np.ndarray, path: Path) -> tuple[str, ...]:
    """Class names, "0", "1", … when the file has none. C classes at most one per image: a stray large label would
    make a classifier (and a kNN vote) with millions of empty classes."""
    num_classes = int(labels.max()) + 1
    if num_classes > len(labels):
        raise PrivfedError(
            f"{path}: labels must be class indices 0..C-1 with C at most the {len(labels)} images, "
            f"but the largest label is {num_classes - 1}"
        )
    if stored is None:
        return tuple(str(i) for i in range(num_classes))
    names = tuple(str(name) for name in np.asarray(stored).reshape(-1))
    if len(names) < num_classes:
        raise PrivfedError(
            f"{path}: 'classes' names {len(names)} classes but labels go up to {num_classes - 1}"
        )
    return names


def _select_split(
    x: np.ndarray,
    y: np.ndarray,
    test_pair: tuple[np.ndarray, np.ndarray] | None,
    split: Split,
) -> tuple[np.ndarray, np.ndarray]:
    """The requested split of the file's arrays."""
    if test_pair is not None:
        if split == "train":
            return x, y
        if split == "test":
            return test_pair
        return np.concatenate([x, test_pair[0]]), np.concatenate([y, test_pair[1]])
    if split == "all":
        return x, y
    train_idx, test_idx = split_indices(len(y))
    idx = train_idx if split == "train" else test_idx
    return x[idx], y[idx]


def _hwc(x: np.ndarray) -> str:
    """An image array's per-image shape, for messages."""
    return "×".join(str(d) for d in x.shape[1:])
