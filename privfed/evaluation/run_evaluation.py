"""``privfed evaluate``: score a saved encoder on any labelled datasets."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from privfed.config import DEFAULTS
from privfed.data.datasets import evaluation_splits, load_dataset
from privfed.device import resolve_device
from privfed.errors import PrivfedError
from privfed.evaluation.features import extract_features
from privfed.evaluation.knn import knn_accuracy
from privfed.evaluation.linear_probe import linear_probe_accuracy
from privfed.runs import RunDirectory, load_network

PROTOCOLS = ("knn", "linear")


def evaluate_run(
    run_path: Path,
    *,
    train_data: str,
    test_data: str,
    protocol: str,
    checkpoint: str = "final",
    data_dir: Path = Path(DEFAULTS.data_dir),
    download: bool = DEFAULTS.download,
    device: str = DEFAULTS.device,
    knn_k: int = DEFAULTS.knn_k,
    knn_temperature: float = DEFAULTS.knn_temperature,
) -> dict[str, Any]:
    """Evaluates one checkpoint of a run and appends the result to ``evaluation.json``.

    Features come from the frozen online backbone, as in the paper's probes.
    Options it shares with training default to ``privfed train``'s defaults.
    """
    if protocol not in PROTOCOLS:
        raise PrivfedError(f"unknown protocol {protocol!r} (choose from {', '.join(PROTOCOLS)})")
    run = RunDirectory(run_path)
    if not run.path.is_dir():
        raise PrivfedError(f"run directory not found: {run.path}")
    config = run.config()
    checkpoint_file = run.checkpoint_path(checkpoint)
    network = load_network(config, checkpoint_file)
    train_split, test_split = evaluation_splits(train_data, test_data)
    train = load_dataset(train_data, split=train_split, data_dir=data_dir, download=download)
    test = load_dataset(test_data, split=test_split, data_dir=data_dir, download=download)
    torch_device = resolve_device(device)
    start = time.perf_counter()
    backbone = network.online.backbone
    train_features = extract_features(backbone, train.to_tensor(), device=torch_device)
    test_features = extract_features(backbone, test.to_tensor(), device=torch_device)
    train_labels, test_labels = torch.as_tensor(train.labels), torch.as_tensor(test.labels)
    if protocol == "knn":
        accuracy = knn_accuracy(
            train_features, train_labels, test_features, test_labels, k=knn_k, temperature=knn_temperature
        )
    else:
        accuracy = linear_probe_accuracy(train_features, train_labels, test_features, test_labels)
    result = {
        "protocol": protocol,
        "accuracy": accuracy,
        "checkpoint": str(checkpoint_file),
        "train_data": train_data,
        "test_data": test_data,
        "train_split": train_split,  # "all": the whole file; "train"/"test": the dataset's own split
        "test_split": test_split,
        "num_train": len(train),
        "num_test": len(test),
        "seconds": time.perf_counter() - start,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if protocol == "knn":
        result.update(k=knn_k, temperature=knn_temperature)
    path = run.path / "evaluation.json"
    history = json.loads(path.read_text())["evaluations"] if path.is_file() else []
    run.write_json("evaluation.json", {"evaluations": [*history, result]})
    return result
