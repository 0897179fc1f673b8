"""``privfed evaluate``: score a saved encoder on any labelled datasets."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from privfed.config import DEFAULTS
from privfed.data import ImageArrays
from privfed.data.datasets import evaluation_splits, load_dataset
from privfed.device import resolve_device
from privfed.errors import PrivfedError
from privfed.evaluation.embedding import save_embedding_figure, subset, tsne_2d
from privfed.evaluation.features import extract_features
from privfed.evaluation.knn import knn_accuracy
from privfed.evaluation.linear_probe import linear_probe_accuracy
from privfed.runs import RunDirectory, load_network

PROTOCOLS = ("knn", "linear", "tsne")
#: Protocols that score a probe learnt on the train data (t-SNE only draws the test data).
PROBES = ("knn", "linear")


def evaluate_run(
    run_path: Path,
    *,
    train_data: str | None,
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
    ``tsne`` scores nothing: it draws the test representations coloured by
    class into ``RUN_DIR/embedding-tsne-<checkpoint>.png``. Options it
    shares with training default to ``privfed train``'s defaults.
    """
    if protocol not in PROTOCOLS:
        raise PrivfedError(f"unknown protocol {protocol!r} (choose from {', '.join(PROTOCOLS)})")
    if protocol in PROBES and train_data is None:
        raise PrivfedError(f"the {protocol} protocol learns from labelled data: give --train-data")
    run = RunDirectory(run_path)
    if not run.path.is_dir():
        raise PrivfedError(f"run directory not found: {run.path}")
    config = run.config()
    checkpoint_file = run.checkpoint_path(checkpoint)
    network = load_network(config, checkpoint_file)
    train_split, test_split = evaluation_splits(train_data, test_data)
    test = load_dataset(test_data, split=test_split, data_dir=data_dir, download=download)
    torch_device = resolve_device(device)
    start = time.perf_counter()
    backbone = network.online.backbone
    result: dict[str, Any] = {"protocol": protocol, "checkpoint": str(checkpoint_file), "test_data": test_data,
                              "test_split": test_split}
    if protocol == "tsne":
        picture = run.path / f"embedding-tsne-{checkpoint_file.stem}.png"
        shown = draw_embedding(backbone, test, picture, device=torch_device, checkpoint=checkpoint_file.stem)
        result.update(accuracy=None, picture=str(picture), num_test=shown)
    else:
        assert train_data is not None  # checked above
        train = load_dataset(train_data, split=train_split, data_dir=data_dir, download=download)
        accuracy = probe_accuracy(
            protocol, backbone, train, test, device=torch_device, knn_k=knn_k, knn_temperature=knn_temperature
        )
        if protocol == "knn":
            result.update(k=knn_k, temperature=knn_temperature)
        result.update(accuracy=accuracy, train_data=train_data, train_split=train_split,  # "all": the whole file
                      num_train=len(train), num_test=len(test))
    result.update(seconds=time.perf_counter() - start, time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    run.append_evaluation(result)
    return result


def probe_accuracy(
    protocol: str,
    backbone: torch.nn.Module,
    train: ImageArrays,
    test: ImageArrays,
    *,
    device: torch.device,
    knn_k: int,
    knn_temperature: float,
) -> float:
    """Test accuracy of a kNN or linear probe learnt on ``train``'s frozen features."""
    train_features = extract_features(backbone, train.to_tensor(), device=device)
    test_features = extract_features(backbone, test.to_tensor(), device=device)
    train_labels, test_labels = torch.as_tensor(train.labels), torch.as_tensor(test.labels)
    if protocol == "knn":
        return knn_accuracy(train_features, train_labels, test_features, test_labels, k=knn_k, temperature=knn_temperature)
    return linear_probe_accuracy(train_features, train_labels, test_features, test_labels)


def draw_embedding(backbone: torch.nn.Module, test: ImageArrays, picture: Path, *, device: torch.device, checkpoint: str) -> int:
    """Draws a seeded subset of ``test``'s representations by t-SNE; returns how many points it shows."""
    shown = subset(len(test))
    features = extract_features(backbone, test.to_tensor()[torch.as_tensor(shown)], device=device)
    save_embedding_figure(
        tsne_2d(features), test.labels[shown], test.classes, picture,
        title=f"t-SNE of {len(shown)} {test.name} test representations ({checkpoint} checkpoint)",
    )
    return len(shown)
