"""Aten ops one client's local-training step issues, counted by torch's profiler.

On a GPU a small-batch step is bound by kernel launches, so the number of
operators per step is what batching and fusing must bring down. The count
covers a whole step of :func:`privfed.orchestra.client_update.train_locally`:
augmentation, encoder passes, backward, SGD, the EMA target and the memory.
"outer" ops are those no other aten op called (``aten::linear`` counts, the
``aten::addmm`` under it does not); "all" counts nested ones apiece. Either
is a launch proxy the CPU can measure, not a GPU kernel count.

    python benchmarks/ops_per_step.py                       # resnet18, batch 16, Orchestra
    python benchmarks/ops_per_step.py --backbone resnet8 --method rotpred
"""

from __future__ import annotations

import argparse
import collections
import json

import torch
from torch.profiler import ProfilerActivity, profile

from privfed.config import build_config
from privfed.methods import build_network
from privfed.orchestra.client_update import train_locally
from privfed.orchestra.local_training import LocalTrainingConfig


def ops_per_step(backbone: str, method: str, batch_size: int, steps: int) -> dict[str, float]:
    """Aten ops per step (all, and by name for the ten most frequent) over ``steps`` steps after one warm-up round."""
    config = build_config(backbone=backbone, method=method, batch_size=batch_size, local_epochs=1, memory_size=128)
    network = build_network(config)
    local = LocalTrainingConfig.from_run(config)
    images = torch.randint(0, 256, (batch_size * steps, 3, 32, 32), dtype=torch.uint8)
    centroids = torch.nn.functional.normalize(torch.randn(config.num_global_centroids, network.projection_dim), dim=1)
    run = lambda seed: train_locally(  # noqa: E731
        network, images, centroids, local, generator=torch.Generator().manual_seed(seed), device=torch.device("cpu")
    )
    run(0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = run(1)
    aten = [event for event in prof.events() if event.name.startswith("aten::")]
    outer = collections.Counter(event.name for event in aten if not inside_aten(event))
    per_step = lambda count: round(count / result.num_steps, 1)  # noqa: E731
    return {"steps": result.num_steps, "outer_aten_ops_per_step": per_step(sum(outer.values())),
            "all_aten_ops_per_step": per_step(len(aten)),
            **{name: per_step(count) for name, count in outer.most_common(25)}}


def inside_aten(event: object) -> bool:
    """Whether an op was called by another aten op (counted with its caller, as one launch site)."""
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--method", default="orchestra")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(json.dumps(ops_per_step(args.backbone, args.method, args.batch_size, args.steps), indent=1))


if __name__ == "__main__":
    main()
