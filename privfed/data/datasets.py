"""Dataset specs: one string names every dataset privfed can train on (docs/usage.md, "Data").

Resolved here only, so the CLI, configs and tests agree, and every problem is a one-line :class:`PrivfedError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from privfed.data.arrays import ImageArrays, Split, has_test_arrays, load_npz
from privfed.data.shapes import make_shapes
from privfed.errors import PrivfedError

DATASET_NAMES: tuple[str, ...] = ("shapes", "cifar10", "cifar100", "arrays")

SHAPES_TRAIN_SIZE = 5000
SHAPES_TEST_SIZE = 1000
SHAPES_TRAIN_SEED = 0
SHAPES_TEST_SEED = 1
#: The most images ``shapes:N`` generates: about 3 GB of 32×32 RGB images, 60 times CIFAR-10's training set.
MAX_SHAPES_SIZE = 1_000_000

# torchvision's folder name under ``data_dir`` and a display name per CIFAR.
_CIFAR_DIRS = {
    "cifar10": ("cifar-10-batches-py", "CIFAR-10"),
    "cifar100": ("cifar-100-python", "CIFAR-100"),
}
_CIFAR_NOTE = (
    "via torchvision under --data-dir (50,000 train / 10,000 test); --download fetches it; "
    ":N trains on N images, class-balanced and drawn with the run's seed"
)


def describe_datasets() -> dict[str, str]:
    """One line per dataset name, for ``--help`` text and ``privfed datasets``."""
    return {
        "shapes": (
            f"embedded synthetic 10-class 32×32 shapes, no download; "
            f"{SHAPES_TRAIN_SIZE} train / {SHAPES_TEST_SIZE} test (shapes:N sets the train size)"
        ),
        "cifar10": f"CIFAR-10 {_CIFAR_NOTE}",
        "cifar100": f"CIFAR-100 {_CIFAR_NOTE}",
        "arrays": (
            "arrays:PATH — an .npz with uint8 x (N×H×W×3), integer y, optional classes "
            "(and x_test/y_test; otherwise a fixed 80/20 split)"
        ),
    }


def _parts(spec: str) -> tuple[str, str | None]:
    """A spec's lower-case name and its argument after ``:`` (None without a ``:``), both stripped."""
    name, sep, arg = spec.strip().partition(":")
    return name.strip().lower(), arg.strip() if sep else None


def arrays_file(spec: str | None) -> Path | None:
    """The file an ``arrays:PATH`` spec names, resolved (None for any other dataset, or none)."""
    name, arg = _parts(spec or "")
    return Path(arg).expanduser().resolve() if name == "arrays" and arg else None


def evaluation_splits(train_spec: str | None, test_spec: str) -> tuple[Split, Split]:
    """The splits a probe learns from and is scored on (docs/usage.md, "Evaluate a saved encoder"); ``train_spec``
    None: only test data is named (a picture needs no probe)."""
    train_file, test_file = arrays_file(train_spec), arrays_file(test_spec)
    if train_file is not None and train_file == test_file:
        return "train", "test"

    def whole_unless_split(path: Path | None, role: Split) -> Split:
        return "all" if path is not None and not has_test_arrays(path) else role

    return whole_unless_split(train_file, "train"), whole_unless_split(test_file, "test")


def load_dataset(
    spec: str,
    *,
    split: Split,
    data_dir: Path,
    download: bool = False,
    seed: int = 0,
) -> ImageArrays:
    """The dataset a spec names: ``shapes[:N]``, ``cifar10[:N]``, ``cifar100[:N]`` or ``arrays:PATH``.

    Args:
        split: "train", "test", or "all" (the whole file; ``arrays:PATH`` only).
        download: Allow fetching CIFAR into ``data_dir``; off, nothing touches the network.
        seed: Draws the subset of ``cifar10:N`` (the run's seed); the test split stays whole.

    Raises:
        PrivfedError: For an unknown spec, a bad size, or missing/corrupt files.
    """
    if split not in ("train", "test", "all"):
        raise PrivfedError(f"unknown split {split!r}: expected 'train', 'test' or 'all'")
    name, arg = _parts(spec)
    if name == "arrays":
        if not arg:
            raise PrivfedError("dataset 'arrays' needs a path: arrays:PATH/TO/FILE.npz")
        return load_npz(Path(arg).expanduser(), split=split)
    if split == "all":
        raise PrivfedError(f"only an arrays:PATH file can be used whole, not {spec!r}")
    part: Literal["train", "test"] = split
    if name == "shapes":
        return _load_shapes(arg, part)
    if name in _CIFAR_DIRS:
        size = None if arg is None else _parse_size(arg, spec)  # checked before anything is read
        data = _load_cifar(name, part, Path(data_dir), download)
        return data if size is None or part == "test" else balanced_subset(data, size, seed=seed, spec=spec)
    valid = ", ".join(["shapes", "shapes:N", "cifar10[:N]", "cifar100[:N]", "arrays:PATH"])
    raise PrivfedError(f"unknown dataset {spec!r}; valid datasets: {valid}")


def _load_shapes(size_arg: str | None, split: Literal["train", "test"]) -> ImageArrays:
    """The embedded shapes dataset (fixed, distinct seeds for train and test)."""
    size = SHAPES_TRAIN_SIZE if size_arg is None else _parse_size(size_arg, f"shapes:{size_arg}")  # either split
    if split == "test":
        return make_shapes(SHAPES_TEST_SIZE, seed=SHAPES_TEST_SEED)
    return make_shapes(size, seed=SHAPES_TRAIN_SEED)


def _parse_size(text: str, spec: str) -> int:
    """The N of ``shapes:N`` or ``cifar10:N`` (a positive integer; ``_`` separators allowed)."""
    name = spec.partition(":")[0].strip().lower()
    try:
        size = int(text.strip())
    except ValueError:
        raise PrivfedError(f"{name}:N needs a whole number of images, got {text!r}") from None
    if size < 1:
        raise PrivfedError(f"{name}:N needs at least 1 image, got {size}")
    if name == "shapes" and size > MAX_SHAPES_SIZE:
        raise PrivfedError(f"shapes:N generates at most {MAX_SHAPES_SIZE:,} images (about 3 GB), got {size:,}")
    return size


def balanced_subset(data: ImageArrays, size: int, *, seed: int, spec: str = "a subset") -> ImageArrays:
    """``size`` images of ``data`` in their order, as equal a share of every class as the class sizes allow.

    Balanced so that a small CPU-sized subset keeps every class (a uniform draw would skew a Dirichlet split
    further); ``seed`` draws the images and the classes that get the remainder. PrivfedError when there are fewer.
    """
    if size > len(data):
        raise PrivfedError(f"{spec} asks for {size} training images; the data has {len(data)}")
    rng = np.random.default_rng(seed)
    members = [np.flatnonzero(data.labels == label) for label in np.unique(data.labels)]
    quota = np.zeros(len(members), dtype=np.int64)
    left = size
    while left:  # water-filling: an equal share for every class that still has images, seeded tie-breaks
        open_ = np.array([i for i, m in enumerate(members) if quota[i] < m.size])
        share = left // open_.size
        if share == 0:
            quota[rng.choice(open_, size=left, replace=False)] += 1
            break
        for i in open_:
            take = min(share, members[i].size - quota[i])
            quota[i] += take
            left -= take
    chosen = np.concatenate([rng.choice(m, size=q, replace=False) for m, q in zip(members, quota)])
    return data.subset(np.sort(chosen))


def check_dataset_present(spec: str, *, data_dir: Path, download: bool) -> None:
    """Refuses (PrivfedError, naming both ways to get it) a dataset neither on disk nor allowed to download,
    without reading it: a study stops before its first cell instead of failing every cell."""
    name, arg = _parts(spec)
    if name == "arrays" and arg and not Path(arg).expanduser().exists():
        load_npz(Path(arg).expanduser(), split="all")  # raises its not-found error, reading nothing
    if name in _CIFAR_DIRS and not download:
        _check_cifar_folder(name, Path(data_dir))


def _check_cifar_folder(name: str, data_dir: Path) -> None:
    folder, title = _CIFAR_DIRS[name]
    if not (data_dir / folder).is_dir():
        raise PrivfedError(
            f"{title} not found: {data_dir / folder} does not exist; add --download to fetch it into {data_dir} "
            f"(about 170 MB; download = true in a study's [base]), or train on a local copy with --dataset arrays:PATH.npz"
        )


def _load_cifar(
    name: str, split: Literal["train", "test"], data_dir: Path, download: bool
) -> ImageArrays:
    """CIFAR-10/100 through torchvision, downloaded only when allowed."""
    title = _CIFAR_DIRS[name][1]
    if not download:
        _check_cifar_folder(name, data_dir)
    from torchvision import datasets  # lazy: importing torchvision costs ~1 s

    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    try:
        ds = cls(root=str(data_dir), train=split == "train", download=download)
    except RuntimeError as err:  # torchvision: "Dataset not found or corrupted."
        hint = "" if download else "; pass --download to fetch a fresh copy"
        raise PrivfedError(
            f"{title} under {data_dir} is incomplete or corrupt: {err}{hint}"
        ) from err
    except OSError as err:  # network or disk problems while downloading
        raise PrivfedError(
            f"could not download {title} into {data_dir}: {err}; without a network, use a local copy: --dataset arrays:PATH.npz"
        ) from err
    images = np.ascontiguousarray(ds.data, dtype=np.uint8)
    labels = np.asarray(ds.targets, dtype=np.int64)
    return ImageArrays(images, labels, tuple(ds.classes), name)
