"""How Orchestra's round data is packed into Flower's legacy messages.

Server -> client (``FitIns``): ``parameters`` is the travelling network state,
one array per key of :func:`privfed.orchestra.model_state.shared_keys`;
``config`` holds ``task`` ("init" or "train"), ``round``, ``centroids`` (bytes;
absent in round 0 and for methods without centroids) and, in SecAgg+ rounds,
``secagg_scales`` (bytes) and the declared encoding (``secagg_max_weight``,
``secagg_clipping_range``, ``secagg_quantization_range``, ``secagg_modulus_range``).
Nothing else: a client reads the rest from its declared run and refuses any other key.

Client -> server (``FitRes``): ``parameters`` is the model delta, same keys
(empty in round 0); under SecAgg+ it is rescaled and followed by two indicator
vectors and one array of training metrics (:mod:`privfed.secagg.encoding`),
masked, so only the weighted mean reaches the strategy. ``metrics`` holds the
training metrics (inside the masked sum under SecAgg+; not the losses under
DP-SGD), the mechanism's release, not summed and absent for methods that release
nothing (``release_vectors``/``release_weights`` as bytes, or for a table
release only its ``release_table``; ``release_guarantee`` and ``release_events``
as JSON), and the round's DP-SGD cost ``dp_sgd_events``
(JSON list, empty without DP-SGD and in round 0). A secure-sum mechanism's share
(:data:`privfed.secagg.masking.SHARE_KEY`) is there only between the client and
its SecAgg+ mod, which moves it into the masked vector.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from flwr.common import Scalar, bytes_to_ndarray, ndarray_to_bytes

from mechanisms.base import Release, TableRelease
from privfed.orchestra.model_state import StateDict
from privfed.privacy.ledger import events_to_json

RELEASE_KEYS = ("release_vectors", "release_weights", "release_table", "release_guarantee", "release_events")


def state_to_arrays(state: StateDict, keys: list[str]) -> list[np.ndarray]:
    return [state[k].detach().cpu().numpy() for k in keys]


def arrays_to_state(arrays: list[np.ndarray], keys: list[str], *, copy: bool = True) -> StateDict:
    """The arrays as a state dict; ``copy=False`` shares writable arrays no one else holds (e.g. just read from a
    message: 0.1 s per ResNet-18 saved), read-only ones are copied."""
    if len(arrays) != len(keys):
        raise ValueError(f"expected {len(keys)} arrays for the network state, got {len(arrays)}")
    return {k: torch.from_numpy(np.array(a, copy=True) if copy or not a.flags.writeable else a) for k, a in zip(keys, arrays)}


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    return ndarray_to_bytes(tensor.detach().cpu().numpy())


def bytes_to_tensor(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.array(bytes_to_ndarray(data), copy=True))


def encode_release(release: Release) -> dict[str, Scalar]:
    """Release -> FitRes metrics entries (single values: Flower's records hold no lists here); a table release
    sends its table alone, from which the server computes its vectors and weights."""
    if isinstance(release, TableRelease):
        arrays = {"release_table": tensor_to_bytes(release.table)}
    else:
        arrays = {
            "release_vectors": tensor_to_bytes(release.vectors.float()),
            "release_weights": tensor_to_bytes(release.weights.float()),
        }
    return {
        **arrays,
        "release_guarantee": json.dumps(release.guarantee.to_dict()),
        "release_events": events_to_json(release.events),
    }


def has_release(metrics: dict[str, Any]) -> bool:
    """Whether a reply carries a release at all (a method that does not cluster sends none)."""
    return any(k in metrics for k in RELEASE_KEYS)
