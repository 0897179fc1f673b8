"""The part of the network state that travels between server and clients.

Only floating-point tensors travel (weights and BatchNorm statistics of the
online and target encoders and the rotation head); integer counters such as
``num_batches_tracked`` stay where they are. Clients send *deltas* so that
aggregated values stay small (what secure aggregation's quantisation needs).
"""

from __future__ import annotations

import functools
import operator

import torch
import torch.nn as nn

StateDict = dict[str, torch.Tensor]


def shared_keys(module: nn.Module) -> list[str]:
    """Names of the floating-point state entries, in a fixed order."""
    return [k for k, v in module.state_dict().items() if v.dtype.is_floating_point]


def shared_state(module: nn.Module) -> StateDict:
    state = module.state_dict()
    return {k: state[k].detach().cpu().clone() for k in shared_keys(module)}


def load_shared_state(module: nn.Module, state: StateDict) -> None:
    """Loads the travelling entries, leaving the rest of the state untouched."""
    missing = set(shared_keys(module)) - set(state)
    if missing:
        raise ValueError(f"state is missing {len(missing)} entries, e.g. {sorted(missing)[0]}")
    module.load_state_dict(state, strict=False)


def state_delta(after: StateDict, before: StateDict) -> StateDict:
    return {k: after[k] - before[k] for k in before}


def weighted_mean(deltas: list[StateDict], weights: list[float]) -> StateDict:
    """FedAvg: the weight-proportional mean of client deltas."""
    if not deltas:
        raise ValueError("nothing to average")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights must have a positive sum")
    return {
        k: functools.reduce(operator.add, (d[k].double() * (w / total) for d, w in zip(deltas, weights))).to(deltas[0][k].dtype)
        for k in deltas[0]
    }


def apply_delta(state: StateDict, delta: StateDict) -> StateDict:
    return {k: state[k] + delta[k] for k in state}
