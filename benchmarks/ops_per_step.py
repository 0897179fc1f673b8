"""Aten ops one client's local-training step issues, counted by torch's profiler.

On a GPU a small-batch step is bound by kernel launches, so the number of
operators per step is what batching and fusing must bring down. The count
covers a whole step of :func:`privfed.orchestra.client_update.train_locally`:
augmentation, encoder passes, backward, SGD, the EMA target and the memory.
"outer" ops are those no other aten op called (``aten::linear`` counts, the
``aten::addmm`` under it does not); "all" counts nested ones apiece;
"computing" counts leaf ops that are not views. Each is a launch proxy the
CPU can measure, not a GPU kernel count.

    python benchmarks/ops_per_step.py                       # resnet18, batch 16, Orchestra
    python benchmarks/ops_per_step.py --backbone resnet8 --method rotpred
    python benchmarks/ops_per_step.py --clients 4          # one step of a cohort of 4 clients
"""

from __future__ import annotations

import argparse
import collections
import json
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from privfed.config import build_config
from privfed.methods import build_network
from privfed.orchestra.client_update import train_locally
from privfed.orchestra.cohort_training import CohortMember, train_cohort
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.orchestra.model_state import shared_state


def ops_per_step(backbone: str, method: str, batch_size: int, steps: int, clients: int = 0) -> dict[str, float]:
    """Aten ops per step (all, and by name for the most frequent) over ``steps`` steps after one warm-up round.

    ``clients`` 0 profiles one client's :func:`train_locally`; N profiles a cohort of N equal clients
    (:func:`train_cohort`), whose step serves all N: a count that grows with N means a per-client loop.
    """
    config = build_config(backbone=backbone, method=method, batch_size=batch_size, local_epochs=1, memory_size=128)
    network = build_network(config)
    local = LocalTrainingConfig.from_run(config)
    images = torch.randint(0, 256, (batch_size * steps, 3, 32, 32), dtype=torch.uint8)
    centroids = torch.nn.functional.normalize(torch.randn(config.num_global_centroids, network.projection_dim), dim=1)
    cpu = torch.device("cpu")
    if clients:
        state = shared_state(network)
        run = lambda seed: train_cohort(  # noqa: E731
            network, state, centroids, [CohortMember(images, torch.Generator().manual_seed(seed + k)) for k in range(clients)],
            local, device=cpu, slots=clients,
        )[0].result
    else:
        run = lambda seed: train_locally(  # noqa: E731
            network, images, centroids, local, generator=torch.Generator().manual_seed(seed), device=cpu
        )
    run(0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = run(1)
    aten = [event for event in prof.events() if event.name.startswith("aten::")]
    outer = collections.Counter(event.name for event in aten if not inside_aten(event))
    computing = [event for event in aten if _computes(event)]
    per_step = lambda count: round(count / result.num_steps, 1)  # noqa: E731
    return {"clients": clients or 1, "steps": result.num_steps, "outer_aten_ops_per_step": per_step(sum(outer.values())),
            "all_aten_ops_per_step": per_step(len(aten)), "computing_ops_per_step": per_step(len(computing)),
            **{name: per_step(count) for name, count in outer.most_common(25)}}


#: Ops that only make views or read metadata: no kernel runs on a GPU.
VIEW_OPS = frozenset(
    f"aten::{name}" for name in (
        "view", "reshape", "_reshape_alias", "permute", "transpose", "t", "unsqueeze", "squeeze", "select", "slice",
        "expand", "as_strided", "detach", "alias", "movedim", "_unsafe_view", "unbind", "split", "split_with_sizes",
        "narrow", "empty", "empty_like", "empty_strided", "to", "lift_fresh", "result_type", "resolve_conj",
        "resolve_neg", "_has_compatible_shallow_copy_type", "is_nonzero", "numel", "size", "stride", "contiguous",
        "flatten", "view_as", "expand_as", "chunk", "unflatten", "_nested_tensor_from_mask_left_aligned", "set_",
        "requires_grad_", "_local_scalar_dense", "item", "_to_copy",
    )
)


def _computes(event: Any) -> bool:
    """A leaf op (it calls no other aten op) that is not a view: the closest the CPU profile gets to a kernel launch."""
    return event.name not in VIEW_OPS and not any(child.name.startswith("aten::") for child in event.cpu_children)


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
    parser.add_argument("--clients", type=int, default=0, help="0: one client alone; N: a cohort of N")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(json.dumps(ops_per_step(args.backbone, args.method, args.batch_size, args.steps, args.clients), indent=1))


if __name__ == "__main__":
    main()
