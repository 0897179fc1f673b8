"""The linear probe: the hand-written SGD loop privfed used until issue 33 against scikit-learn's L-BFGS.

Both probes learn from the same frozen resnet8 features of the CIFAR-10 dev
images (``privfed evaluate --protocol linear`` extracts them the same way:
L2-normalised backbone outputs of un-augmented images) and are scored on a
held-out 20 %. Rows, for each encoder:

* ``sgd``: the former probe (standardised features, SGD with momentum 0.9,
  lr 0.1, cosine schedule, weight decay 1e-5, batch 256, 100 epochs, seeded);
* ``lbfgs C=...``: scikit-learn's multinomial ``LogisticRegression`` on the
  same standardised features (``privfed.evaluation.linear_probe``; its
  default ``C`` is marked ``*``).

Encoders: ``untrained``, a freshly initialised resnet8 (seed s), and
``trained``, the final checkpoint of ``--run`` (one run; its self-supervised
training saw the images unlabelled, which is fine here: both probes see the
same features). Seed s draws the 80/20 split of the 5,085 images, the
untrained encoder and the SGD probe's order. Cells are mean ± sample std over
the seeds; ``same twice`` says whether every fit, repeated on the same input,
predicted exactly the same classes; ``minus sgd, paired`` is the accuracy
minus the SGD probe's on the same seed. ``sgd probe seeds`` gives the range of the
SGD probe's accuracy over probe seeds 0, 1, 2 on seed 0's features and split
(L-BFGS has no seed).

    privfed train --config configs/cpu-cifar10.toml --dataset arrays:../shared/data/cifar10-dev.npz \\
        --rounds 3 --runtime local --seed 0 --out /tmp/probe-run
    python benchmarks/linear_probe_comparison.py --run /tmp/probe-run

Without ``--run`` only the untrained encoder is compared. One CPU thread.
``--scale`` adds one timing at the paper presets' size (50,000 training and
10,000 test features of 512 dimensions, as resnet18 on CIFAR-10 gives), on
synthetic features: 10 Gaussian classes around random means, L2-normalised,
about half of them separable.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from privfed.config import TrainConfig
from privfed.data.arrays import load_npz
from privfed.device import resolve_device
from privfed.evaluation.features import extract_features
from privfed.evaluation.linear_probe import DEFAULT_C, linear_probe_predictions
from privfed.methods import build_network
from privfed.run.directory import RunDirectory, load_network

CS = (0.01, 0.1, 1.0, 10.0)
TRAIN_FRACTION = 0.8

Probe = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


def sgd_predictions(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    seed: int,
    *,
    epochs: int = 100,
    lr: float = 0.1,
    weight_decay: float = 1e-5,
    batch_size: int = 256,
) -> torch.Tensor:
    """The former probe (privfed.evaluation.linear_probe before issue 33), returning predictions."""
    generator = torch.Generator().manual_seed(seed)
    mean, std = train_features.mean(0), train_features.std(0).clamp_min(1e-6)
    x_train, x_test = (train_features - mean) / std, (test_features - mean) / std
    classifier = nn.Linear(x_train.shape[1], int(train_labels.max()) + 1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        classifier.reset_parameters()
    optimizer = torch.optim.SGD(classifier.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
    for _ in range(epochs):
        for index in torch.randperm(x_train.shape[0], generator=generator).split(batch_size):
            loss = F.cross_entropy(classifier(x_train[index]), train_labels[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        scheduler.step()
    with torch.no_grad():
        return classifier(x_test).argmax(dim=1)


def lbfgs(c: float) -> Probe:
    """The scikit-learn probe at inverse regularisation ``c`` (it has no seed)."""
    return lambda x_train, y_train, x_test, seed: linear_probe_predictions(x_train, y_train, x_test, c=c)


def probes() -> dict[str, Probe]:
    named: dict[str, Probe] = {"sgd": sgd_predictions}
    for c in CS:
        named[f"lbfgs C={c:g}" + (" *" if c == DEFAULT_C else "")] = lbfgs(c)
    return named


def split(num: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.from_numpy(np.random.default_rng(seed).permutation(num))
    cut = round(TRAIN_FRACTION * num)
    return order[:cut], order[cut:]


def measure(probe: Probe, features: torch.Tensor, labels: torch.Tensor, seed: int) -> tuple[float, float, bool]:
    """Accuracy, seconds of one fit and prediction, and whether a second fit predicted the same."""
    train, test = split(len(labels), seed)
    start = time.perf_counter()
    first = probe(features[train], labels[train], features[test], seed)
    seconds = time.perf_counter() - start
    second = probe(features[train], labels[train], features[test], seed)
    return float((first == labels[test]).double().mean()), seconds, bool(torch.equal(first, second))


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.4f}"


def scale_check() -> None:
    """Both probes once on synthetic features of the paper presets' size: seconds and accuracy."""
    generator = torch.Generator().manual_seed(0)
    num, dim, classes = 60_000, 512, 10
    means = 0.003 * torch.randn(classes, dim, generator=generator)
    labels = torch.randint(0, classes, (num,), generator=generator)
    features = F.normalize(means[labels] + torch.randn(num, dim, generator=generator) / dim**0.5, dim=1)
    train, test = slice(0, 50_000), slice(50_000, None)
    print(f"\nscale: {num - 10_000} training and 10000 test synthetic features of {dim} dimensions")
    for name, probe in (("sgd", sgd_predictions), ("lbfgs C=1", lbfgs(1.0))):
        start = time.perf_counter()
        predicted = probe(features[train], labels[train], features[test], 0)
        accuracy = float((predicted == labels[test]).double().mean())
        print(f"  {name:<10} test accuracy {accuracy:.4f}  {time.perf_counter() - start:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/cifar10-dev.npz"))
    parser.add_argument("--run", type=Path, help="a run directory whose final checkpoint gives the trained encoder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--scale", action="store_true", help="also time both probes at the paper presets' feature size")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import sklearn.linear_model  # noqa: F401  (imported now, so the first timed fit does not pay for it)
    device = resolve_device("cpu")
    data = load_npz(args.data, split="all")
    images, labels = data.to_tensor(), torch.as_tensor(data.labels)
    run = RunDirectory(args.run) if args.run else None
    config = run.config() if run else TrainConfig(backbone="resnet8")

    def untrained(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return extract_features(build_network(config).online.backbone, images, device=device)

    encoders: dict[str, Callable[[int], torch.Tensor]] = {"untrained": untrained}
    if run is not None:
        network = load_network(config, run.checkpoint_path("final"))
        trained = extract_features(network.online.backbone, images, device=device)
        encoders["trained"] = lambda seed: trained
    print(f"{len(labels)} images ({args.data}), {len(args.seeds)} seeds {args.seeds}, "
          f"80/20 split, backbone {config.backbone}, torch threads {torch.get_num_threads()}")
    print(f"\n{'encoder':<10} {'probe':<14} {'test accuracy':<18} {'minus sgd, paired':<18} {'seconds per fit':<18} "
          f"{'same twice':<11} {'sgd probe seeds'}")
    sgd_accuracy: list[float] = []
    for encoder, features_of in encoders.items():
        features = {seed: features_of(seed) for seed in args.seeds}
        for name, probe in probes().items():
            figures = [measure(probe, features[seed], labels, seed) for seed in args.seeds]
            if name == "sgd":
                sgd_accuracy = [f[0] for f in figures]
            paired = [f[0] - base for f, base in zip(figures, sgd_accuracy, strict=True)]
            gain = spread(paired) if name != "sgd" else ""
            seeds_range = ""
            if name == "sgd":
                train, test = split(len(labels), args.seeds[0])
                feats = features[args.seeds[0]]
                accs = [float((probe(feats[train], labels[train], feats[test], s) == labels[test]).double().mean())
                        for s in (0, 1, 2)]
                seeds_range = f"{min(accs):.4f} to {max(accs):.4f}"
            print(f"{encoder:<10} {name:<14} {spread([f[0] for f in figures]):<18} {gain:<18} "
                  f"{spread([f[1] for f in figures]):<18} {'yes' if all(f[2] for f in figures) else 'NO':<11} "
                  f"{seeds_range}", flush=True)
        print(f"{'':<10} (features: {features[args.seeds[0]].shape[1]} dimensions)")
    if args.scale:
        scale_check()


if __name__ == "__main__":
    main()
