"""The network state that travels between server and clients: its floating-point tensors (integer counters
such as ``num_batches_tracked`` stay). Clients send *deltas*, small enough for secure aggregation's quantisation.
"""

from __future__ import annotations

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
    """FedAvg: the weight-proportional mean of client deltas, summed in float64 in client order.

    In place (one sum and one scratch buffer per key), each term ``delta.double() * (w / total)`` in the same
    order: bit for bit the plain sum, without three model-sized temporaries per client.
    """
    if not deltas:
        raise ValueError("nothing to average")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights must have a positive sum")
    mean: StateDict = {}
    for k in deltas[0]:
        first = deltas[0][k]
        acc = torch.empty(first.shape, dtype=torch.float64, device=first.device)
        acc.copy_(first).mul_(weights[0] / total)
        term = torch.empty_like(acc) if len(deltas) > 1 else acc
        for d, w in zip(deltas[1:], weights[1:]):
            acc.add_(term.copy_(d[k]).mul_(w / total))
        mean[k] = acc.to(first.dtype)
    return mean


def apply_delta(state: StateDict, delta: StateDict) -> StateDict:
    return {k: state[k] + delta[k] for k in state}
