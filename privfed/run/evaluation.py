"""``privfed evaluate``: score a saved encoder on any labelled datasets."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from privfed.config import DEFAULTS, check_float, check_seed
from privfed.data import ImageArrays
from privfed.data.arrays import size_mismatch
from privfed.data.datasets import evaluation_splits, load_dataset
from privfed.data.federated import FederatedSplit
from privfed.device import resolve_device
from privfed.errors import PrivfedError
from privfed.evaluation.align_uniform import client_align_uniform, mean_over_clients
from privfed.evaluation.embedding import save_embedding_figure, subset, tsne_2d
from privfed.evaluation.features import StepProgress, extract_features
from privfed.evaluation.fine_tuning import FineTuning, fine_tune_accuracy
from privfed.evaluation.knn import knn_accuracy
from privfed.evaluation.linear_probe import linear_probe_accuracy
from privfed.run.directory import RunDirectory, load_network

PROTOCOLS = ("knn", "linear", "finetune", "tsne")
#: Protocols that learn from labelled train data (t-SNE only draws the test data).
PROBES = ("knn", "linear", "finetune")


def evaluate_run(
    run_path: Path,
    *,
    train_data: str | None,
    test_data: str,
    protocol: str,
    label_fraction: float = 0.1,
    seed: int = 0,
    checkpoint: str = "final",
    data_dir: Path = Path(DEFAULTS.data_dir),
    download: bool = DEFAULTS.download,
    device: str = DEFAULTS.device,
    knn_k: int = DEFAULTS.knn_k,
    knn_temperature: float = DEFAULTS.knn_temperature,
    progress: StepProgress | None = None,
) -> dict[str, Any]:
    """Evaluates one checkpoint of a run (its frozen online backbone, as the paper's probes) and appends the result to
    ``evaluation.json`` (docs/usage.md, "Evaluate a saved encoder")."""
    if protocol not in PROTOCOLS:
        raise PrivfedError(f"unknown protocol {protocol!r} (choose from {', '.join(PROTOCOLS)})")
    if protocol in PROBES and train_data is None:
        raise PrivfedError(f"the {protocol} protocol learns from labelled data: give --train-data")
    check_float("label_fraction", label_fraction, 0.0, 1.0, False, True)
    check_float("knn_temperature", knn_temperature, 0.0, math.inf, False, False)
    if knn_k < 1:
        raise PrivfedError(f"knn_k must be at least 1, got {knn_k}")
    check_seed("seed", seed)
    run = RunDirectory(run_path)  # privfed.evaluate has checked that it is a directory
    config = run.config()
    run.evaluations()  # a damaged evaluation.json fails now, not after the result is computed
    checkpoint_file = run.checkpoint_path(checkpoint)
    picture_name = f"embedding-tsne-{checkpoint_file.stem}.png"
    run.check_writable("evaluation.json", *([picture_name] if protocol == "tsne" else []))
    train_split, test_split = evaluation_splits(train_data, test_data)
    test = load_dataset(test_data, split=test_split, data_dir=data_dir, download=download)
    train = None
    if protocol in PROBES:
        assert train_data is not None  # checked above
        train = load_dataset(train_data, split=train_split, data_dir=data_dir, download=download, seed=config.seed)
    check_sizes(protocol, train, test, train_name=f"{train_data} ({train_split})", test_name=f"{test_data} ({test_split})")
    network = load_network(config, checkpoint_file)
    torch_device = resolve_device(device)
    start = time.perf_counter()
    backbone = network.online.backbone
    result: dict[str, Any] = {"protocol": protocol, "checkpoint": str(checkpoint_file), "test_data": test_data,
                              "test_split": test_split}
    if protocol == "tsne":
        picture = run.path / picture_name
        shown = draw_embedding(backbone, test, picture, device=torch_device, checkpoint=checkpoint_file.stem)
        result.update(accuracy=None, picture=str(picture), num_test=shown)
    else:
        assert train is not None  # loaded above for every probe
        result["train_data"] = train_data
        mismatch = size_mismatch(train, test, train_name=f"train ({train_data})", test_name=f"test ({test_data})")
        warnings = [] if mismatch is None else [f"{mismatch}; the probe compares them anyway"]
        if train.labels.min() == train.labels.max():
            warnings.append(
                f"every train ({train_data}) image has label {int(train.labels[0])}, so the probe predicts it for "
                "every test image: the accuracy says nothing about the encoder"
            )
        if warnings:
            result["warnings"] = warnings
        if protocol == "finetune":
            accuracy, labelled = fine_tune_accuracy(
                backbone, train.to_tensor(), torch.as_tensor(train.labels), test.to_tensor(),
                torch.as_tensor(test.labels), fraction=label_fraction, seed=seed, device=torch_device,
                progress=progress,
            )
            result.update(label_fraction=label_fraction, num_labelled=labelled, seed=seed,
                          schedule=dataclasses.asdict(FineTuning()))
        else:
            accuracy = probe_accuracy(
                protocol, backbone, train, test, device=torch_device, knn_k=knn_k, knn_temperature=knn_temperature,
                progress=progress,
            )
        if protocol == "knn":
            result.update(k=knn_k, temperature=knn_temperature)
        result.update(accuracy=accuracy, train_data=train_data, train_split=train_split,  # "all": the whole file
                      num_train=len(train), num_test=len(test))
    result.update(seconds=time.perf_counter() - start, time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    try:
        run.append_evaluation(result)
    except PrivfedError as err:  # evaluation.json was damaged while this ran: keep the result beside it
        kept = run.path / f"evaluation-{time.strftime('%Y%m%d-%H%M%S')}.json"
        kept.write_text(json.dumps(result, indent=2) + "\n")
        raise PrivfedError(f"{err}; this result was kept in {kept}") from None
    return result


#: t-SNE's fewest points: its perplexity must stay below the number of points, and privfed's is at least 4/3.
MIN_TSNE_POINTS = 5


def check_sizes(protocol: str, train: ImageArrays | None, test: ImageArrays, *, train_name: str, test_name: str) -> None:
    """Refuses (PrivfedError) data a protocol cannot score, before the model loads: an empty split, or t-SNE of
    fewer than 5 images. One image is enough otherwise: the kNN vote caps k at the train images."""
    least = MIN_TSNE_POINTS if protocol == "tsne" else 1
    if len(test) < least:
        what = "t-SNE draws at least" if protocol == "tsne" else "the probe needs at least"
        raise PrivfedError(f"{what} {least} test image(s); {test_name} holds {len(test)}")
    if train is not None and len(train) == 0:
        raise PrivfedError(f"the {protocol} probe needs train images; {train_name} holds none")


def probe_accuracy(
    protocol: str,
    backbone: torch.nn.Module,
    train: ImageArrays,
    test: ImageArrays,
    *,
    device: torch.device,
    knn_k: int,
    knn_temperature: float,
    progress: StepProgress | None = None,
) -> float:
    """Test accuracy of a kNN or linear probe learnt on ``train``'s frozen features."""
    train_features = extract_features(backbone, train.to_tensor(), device=device)
    test_features = extract_features(backbone, test.to_tensor(), device=device)
    train_labels, test_labels = torch.as_tensor(train.labels), torch.as_tensor(test.labels)
    if protocol == "knn":
        return knn_accuracy(train_features, train_labels, test_features, test_labels, k=knn_k, temperature=knn_temperature)
    return linear_probe_accuracy(train_features, train_labels, test_features, test_labels, progress=progress)


def draw_embedding(backbone: torch.nn.Module, test: ImageArrays, picture: Path, *, device: torch.device, checkpoint: str) -> int:
    """Draws a seeded subset of ``test``'s representations by t-SNE; returns how many points it shows."""
    shown = subset(len(test))
    features = extract_features(backbone, test.to_tensor()[torch.as_tensor(shown)], device=device)
    save_embedding_figure(
        tsne_2d(features), test.labels[shown], test.classes, picture,
        title=f"t-SNE of {len(shown)} {test.name} test representations ({checkpoint} checkpoint)",
    )
    return len(shown)


def score_run(run_path: Path, *, checkpoint: str = "final", device: str = DEFAULTS.device) -> dict[str, Any]:
    """The label-free tuning score of a run's model (:mod:`privfed.evaluation.align_uniform`): the mean over clients
    (of two images or more) of their own images' score under the online encoder, two views per image seeded by the
    run's seed and the client."""
    run = RunDirectory(run_path)
    config = run.config()
    network = load_network(config, run.checkpoint_path(checkpoint))
    split = FederatedSplit.of(config)
    torch_device = resolve_device(device)
    scores = []
    for client in range(config.num_clients):
        images = split.client_images(client)
        if images.shape[0] >= 2:
            scores.append(client_align_uniform(
                network.online, images, batch_size=max(2, config.batch_size), seed=config.seed * 10_007 + client,
                device=torch_device,
            ))
    mean = mean_over_clients(scores)
    return {"alignment": mean.alignment, "uniformity": mean.uniformity, "tuning_score": mean.score,
            "clients_scored": len(scores)}
