"""The model-sized work of a round outside training, per client, at the paper's size (issue 43, item 3).

Times, on the paper's network (ResNet-18, 512-d projection; 23.4 M shared
values, about 94 MB per model message), what a client and the server do with
each model message besides training, without SecAgg+: the client hashes the
instructions and reads the model, checks and packs its delta; the server
checks the delta and forms FedAvg over ``--clients`` deltas. Run it against
two trees to compare them (median of ``--repeat``):

    PYTHONPATH=. python benchmarks/round_overhead.py --clients 8 --repeat 3 --threads 1
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays

from privfed.config import build_config
from privfed.federation import reply_checks
from privfed.federation.messages import arrays_to_state, state_to_arrays
from privfed.federation.reply_store import instructions_digest
from privfed.methods import build_network
from privfed.orchestra.model_state import shared_keys, shared_state, weighted_mean


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """The median wall and CPU time of ``fn`` over ``repeat`` calls (CPU time holds better on a busy machine)."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def delta_is_finite(delta: dict[str, torch.Tensor]) -> bool:
    """The client's check that its delta holds no NaN or Inf, as this tree does it."""
    try:
        from privfed.federation.client import is_finite
    except ImportError:  # a tree from before the min/max check
        return all(bool(torch.isfinite(v).all()) for v in delta.values())
    return all(is_finite(v) for v in delta.values())


def read_state(arrays: list[np.ndarray], keys: list[str]) -> dict[str, torch.Tensor]:
    """Arrays read from a message as a state, as this tree's client and strategy do it."""
    if "copy" in inspect.signature(arrays_to_state).parameters:
        return arrays_to_state(arrays, keys, copy=False)
    return arrays_to_state(arrays, keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a simulated client runs on one)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    run = build_config(backbone="resnet18", projection_dim=512)
    network = build_network(run)
    keys = shared_keys(network)
    state = shared_state(network)
    shapes = [tuple(state[k].shape) for k in keys]
    values = sum(v.numel() for v in state.values())
    model = ndarrays_to_parameters(state_to_arrays(state, keys))
    ins = FitIns(model, {"task": "train", "round": 1})
    gen = torch.Generator().manual_seed(1)
    deltas = [{k: torch.randn(v.shape, generator=gen) * 1e-3 for k, v in state.items()} for _ in range(args.clients)]
    replies = [ndarrays_to_parameters(state_to_arrays(d, keys)) for d in deltas]
    weights = [float(25 + i) for i in range(args.clients)]

    instructions_digest(ins)  # a round's first client hashes the model
    figures = {
        "client: hash the instructions (a later client)": timed(lambda: instructions_digest(ins), args.repeat),
        "client: read the model": timed(lambda: read_state(parameters_to_ndarrays(model), keys), args.repeat),
        "client: check the delta is finite": timed(lambda: delta_is_finite(deltas[0]), args.repeat),
        "client: pack the delta": timed(lambda: ndarrays_to_parameters(state_to_arrays(deltas[0], keys)), args.repeat),
        "server: check a delta": timed(
            lambda: reply_checks._delta(_Res(replies[0]), shapes, train=True), args.repeat),  # type: ignore[arg-type]
    }
    checked = [reply_checks._delta(_Res(r), shapes, train=True) or [] for r in replies]  # type: ignore[arg-type]
    wall, cpu = timed(lambda: weighted_mean([read_state(c, keys) for c in checked], weights), args.repeat)
    figures["server: FedAvg, per client"] = (wall / args.clients, cpu / args.clients)
    print(f"resnet18: {values / 1e6:.1f} M shared values, {sum(len(t) for t in model.tensors) / 1e6:.0f} MB a model")
    print(f"{'seconds, median of ' + str(args.repeat):52s}   wall    CPU")
    for name, (wall, cpu) in figures.items():
        print(f"{name:52s} {wall:6.3f} {cpu:6.3f}")
    total_wall, total_cpu = sum(w for w, _ in figures.values()), sum(c for _, c in figures.values())
    print(f"{'total per client':52s} {total_wall:6.3f} {total_cpu:6.3f}")


class _Res:
    """What the delta check reads of a fit result: its parameters."""

    def __init__(self, parameters: Any) -> None:
        self.parameters = parameters


if __name__ == "__main__":
    main()
