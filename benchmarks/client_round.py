"""Throughput of one client's local training and the share of its round spent releasing.

Prints, per backbone: samples/s of Orchestra local training (three encoder
passes + backward per batch) and how much of the client's round the mechanism
(local clustering) takes. Runs on the embedded data, no network needed.

    python benchmarks/client_round.py                 # resnet8 and resnet18 on CPU
    python benchmarks/client_round.py --device cuda --images 2048
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from mechanisms import create_mechanism
from privfed.config import build_config
from privfed.data import make_shapes
from privfed.device import resolve_device
from privfed.methods import build_network
from privfed.orchestra.client_update import run_client_round
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.orchestra.model_state import shared_state

SETTINGS = {
    # backbone: (projection dim, batch size, images on the client); one local
    # epoch, and every other setting is `privfed train`'s default
    "resnet8": (128, 32, 512),
    "resnet18": (512, 16, 64),
}


def measure(backbone: str, *, device: torch.device, images: int | None, mechanism: str, repeats: int) -> dict[str, float]:
    dim, batch, default_images = SETTINGS[backbone]
    n = images or default_images
    data = make_shapes(n, seed=0).to_tensor()
    run = build_config(backbone=backbone, projection_dim=dim, batch_size=batch, local_epochs=1)
    torch.manual_seed(0)
    network = build_network(run)
    state = shared_state(network)
    centroids = F.normalize(torch.randn(run.num_global_centroids, dim), dim=1)
    config = LocalTrainingConfig.from_run(run)
    train, release = [], []
    for repeat in range(repeats + 1):  # the first repeat warms up
        update, _ = run_client_round(
            build_network(run), state, centroids, data, train=True,
            config=config, mechanism=create_mechanism(mechanism), num_local_centroids=run.num_local_centroids,
            seed=repeat, device=device,
        )
        if repeat:
            train.append(update.metrics["train_seconds"])
            release.append(update.metrics["release_seconds"])
    steps = update.metrics["steps"]
    t_train, t_release = sum(train) / repeats, sum(release) / repeats
    return {
        "samples_per_s": steps * batch / t_train,
        "train_s": t_train,
        "release_s": t_release,
        "release_share": t_release / (t_train + t_release),
        "images": n,
        "batch": batch,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--images", type=int, default=None, help="images on the client (default per backbone)")
    parser.add_argument("--mechanism", default="kanon")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--backbones", nargs="+", default=list(SETTINGS))
    args = parser.parse_args()
    device = resolve_device(args.device)
    print(f"device={device} threads={torch.get_num_threads()} mechanism={args.mechanism}")
    print(f"{'backbone':<10} {'batch':>5} {'images':>6} {'samples/s':>10} {'train s':>8} {'release s':>9} {'release share':>13}")
    for backbone in args.backbones:
        start = time.perf_counter()
        r = measure(backbone, device=device, images=args.images, mechanism=args.mechanism, repeats=args.repeats)
        print(
            f"{backbone:<10} {r['batch']:>5} {r['images']:>6} {r['samples_per_s']:>10.1f} {r['train_s']:>8.2f} "
            f"{r['release_s']:>9.3f} {100 * r['release_share']:>12.2f}%   ({time.perf_counter() - start:.0f}s)"
        )


if __name__ == "__main__":
    main()
