"""The CIFAR path on real files: folders in torchvision's on-disk format, written here, read by privfed.

What a user has after ``--download``: ``cifar-10-batches-py/`` (five training
batches, a test batch, ``batches.meta``) or ``cifar-100-python/`` (``train``,
``test``, ``meta``), pickled dicts of ``[N, 3072]`` uint8 rows in CHW order.
Only torchvision's md5 check is bypassed (it knows the real files' digests);
it still sees a missing file. privfed's loading, ``cifar10:N`` subset, split
and partition run as they do for a user.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torchvision.datasets.cifar

from privfed.cli import main
from privfed.config import build_config
from privfed.data import FederatedSplit, load_dataset
from privfed.errors import PrivfedError

TRAIN_PER_CLASS = {"cifar10": 30, "cifar100": 3}
TEST_PER_CLASS = {"cifar10": 10, "cifar100": 1}
CLASSES = {"cifar10": 10, "cifar100": 100}


def _rows(per_class: int, classes: int, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
    """Random images in CIFAR's row format, every class ``per_class`` times, in shuffled order."""
    labels = rng.permutation(np.repeat(np.arange(classes), per_class)).tolist()
    return rng.integers(0, 256, size=(len(labels), 3072), dtype=np.uint8), labels


def _dump(path: Path, entry: dict) -> None:
    with path.open("wb") as f:
        pickle.dump(entry, f)


def write_cifar(root: Path, name: str, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Writes a small ``name`` folder under ``root``; returns each split's images (HWC) and labels as written."""
    rng, classes = np.random.default_rng(seed), CLASSES[name]
    train, train_labels = _rows(TRAIN_PER_CLASS[name], classes, rng)
    test, test_labels = _rows(TEST_PER_CLASS[name], classes, rng)
    names = [f"class{c}" for c in range(classes)]
    if name == "cifar10":
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True)
        for index, (rows, labels) in enumerate(zip(np.array_split(train, 5), np.array_split(np.array(train_labels), 5)), 1):
            _dump(folder / f"data_batch_{index}", {"data": rows, "labels": labels.tolist()})
        _dump(folder / "test_batch", {"data": test, "labels": test_labels})
        _dump(folder / "batches.meta", {"label_names": names})
    else:
        folder = root / "cifar-100-python"
        folder.mkdir(parents=True)
        _dump(folder / "train", {"data": train, "fine_labels": train_labels, "coarse_labels": [c // 5 for c in train_labels]})
        _dump(folder / "test", {"data": test, "fine_labels": test_labels, "coarse_labels": [c // 5 for c in test_labels]})
        _dump(folder / "meta", {"fine_label_names": names, "coarse_label_names": [f"super{c}" for c in range(20)]})

    def hwc(rows: np.ndarray) -> np.ndarray:
        return rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)

    return {"train": (hwc(train), np.array(train_labels)), "test": (hwc(test), np.array(test_labels))}


@pytest.fixture(autouse=True)
def no_md5(monkeypatch):
    """torchvision checks each file's md5 against the real CIFAR's; here it checks only that the file exists."""
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda path, md5=None: os.path.isfile(path))


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory) -> tuple[Path, dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]]:
    root = tmp_path_factory.mktemp("cifar")
    return root, {name: write_cifar(root, name) for name in ("cifar10", "cifar100")}


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
@pytest.mark.parametrize("download", [False, True])
def test_both_splits_load_as_written(cifar_root, name, download):
    """``--download`` finds the folder in place and fetches nothing (this machine has no network)."""
    root, written = cifar_root
    for split in ("train", "test"):
        data = load_dataset(name, split=split, data_dir=root, download=download)
        images, labels = written[name][split]
        assert data.images.dtype == np.uint8 and data.images.shape == (len(labels), 32, 32, 3)
        assert np.array_equal(data.images, images) and np.array_equal(data.labels, labels)
        assert data.classes == tuple(f"class{c}" for c in range(CLASSES[name]))


@pytest.mark.parametrize(("spec", "per_class"), [("cifar10:200", {20}), ("cifar10:205", {20, 21}), ("cifar100:150", {1, 2})])
def test_a_sized_spec_is_a_class_balanced_seeded_subset_of_the_files(cifar_root, spec, per_class):
    root, written = cifar_root
    name, size = spec.split(":")
    data = load_dataset(spec, split="train", data_dir=root, seed=3)
    assert len(data) == int(size) and set(np.bincount(data.labels, minlength=CLASSES[name])) == per_class
    images, labels = written[name]["train"]
    rows = {image.tobytes(): label for image, label in zip(images, labels)}
    assert all(rows[image.tobytes()] == label for image, label in zip(data.images, data.labels))
    again, other = (load_dataset(spec, split="train", data_dir=root, seed=s) for s in (3, 4))
    assert np.array_equal(again.images, data.images) and not np.array_equal(other.images, data.images)
    assert len(load_dataset(spec, split="test", data_dir=root, seed=3)) == len(written[name]["test"][1])  # whole


def test_the_federated_split_partitions_the_subset_among_clients(cifar_root):
    root, _ = cifar_root
    config = build_config(dataset="cifar10:200", num_clients=4, alpha=0.5, seed=1, data_dir=str(root))
    split = FederatedSplit.of(config)
    data, parts = split.train_data(), split.partition()
    assert len(data) == 200 and sorted(np.concatenate(parts).tolist()) == list(range(200))
    for client, part in enumerate(parts):
        assert np.array_equal(split.client_images(client).numpy(), data.subset(part).to_tensor().numpy())
        assert np.array_equal(split.client_labels(client).numpy(), data.labels[part])


def test_a_missing_batch_is_one_error_that_names_the_fix(tmp_path):
    write_cifar(tmp_path, "cifar10")
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(PrivfedError, match=r"CIFAR-10 under .* is incomplete or corrupt.*--download"):
        load_dataset("cifar10:100", split="train", data_dir=tmp_path)


def test_one_round_trains_on_the_files(cifar_root, tmp_path, capsys):
    """``privfed train --dataset cifar10:200 --data-dir ROOT``, in this process (so the md5 bypass holds)."""
    root, _ = cifar_root
    out = tmp_path / "run"
    main([
        "train", "--dataset", "cifar10:200", "--data-dir", str(root), "--num-clients", "2", "--participation", "1.0",
        "--rounds", "1", "-L", "4", "-G", "8", "--memory-size", "32", "--batch-size", "16", "--local-epochs", "1",
        "--projection-dim", "16", "--backbone", "resnet8", "--out", str(out),
    ])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"] is None
    assert [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    config = json.loads((out / "config.json").read_text())
    assert config["dataset"] == "cifar10:200"
