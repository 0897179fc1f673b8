"""What a client sends: under ``kanon`` no representation leaves the client.

The check decodes *everything* in the client's ``FitRes`` (every parameter
array and every bytes metric) and looks for any row equal, up to float error,
to a representation the client held. A deliberately leaky mechanism shows the
check can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.common import FitRes, bytes_to_ndarray, ndarrays_to_parameters, parameters_to_ndarrays

from mechanisms import Guarantee, Mechanism, Release
from mechanisms import registry
from privfed.federation.client_app import OrchestraClient
from privfed.federation.messages import decode_release
from privfed.federation.strategy import OrchestraStrategy
from privfed.models import OrchestraNetwork
from privfed.orchestra.model_state import shared_keys
from privfed.orchestra.server import OrchestraServer


class LeakyMechanism(Mechanism):
    """Sends its input unchanged: what the check must catch."""

    name = "leaky-test"
    description = "releases the representations (test only)"

    def guarantee(self, *, num_reps, num_centroids):
        return Guarantee(kind="none", statement="none")

    def release(self, reps, *, num_centroids, generator):
        return Release(reps.clone(), torch.ones(len(reps)), self.guarantee(num_reps=len(reps), num_centroids=0))


def reply_vectors(res: FitRes, dim: int) -> list[np.ndarray]:
    """Every float array in the reply, reshaped to rows of the representation width."""
    arrays = list(parameters_to_ndarrays(res.parameters))
    for value in res.metrics.values():
        if isinstance(value, bytes):
            arrays.append(bytes_to_ndarray(value))
    rows = []
    for array in arrays:
        array = np.asarray(array, dtype=np.float64)
        if array.size and array.size % dim == 0:
            rows.append(array.reshape(-1, dim))
    return rows


def leaked_rows(res: FitRes, memory: torch.Tensor) -> int:
    """How many rows of the reply coincide with a held representation."""
    dim = memory.shape[1]
    mem = memory.double().numpy()
    leaked = 0
    for rows in reply_vectors(res, dim):
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        unit = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)
        leaked += int(((unit @ mem.T) > 0.9999).any(axis=1).sum())
    return leaked


def client_round(config, mechanism_name: str, monkeypatch, task: str) -> tuple[FitRes, torch.Tensor]:
    """Runs the real ClientApp client once, recording what its mechanism was given."""
    seen: list[torch.Tensor] = []
    cls = registry.get_mechanism_class(mechanism_name)
    original = cls.release

    def spy(self, reps, **kwargs):
        seen.append(reps.clone())
        return original(self, reps, **kwargs)

    monkeypatch.setattr(cls, "release", spy)
    torch.manual_seed(0)
    server = OrchestraServer(OrchestraNetwork(config.backbone, config.projection_dim), num_global_centroids=8, seed=0)
    if task == "train":
        server.centroids = F.normalize(torch.randn(8, config.projection_dim), dim=1)
    strategy = OrchestraStrategy(server, config, on_round_end=lambda report: None)
    state = ndarrays_to_parameters([server.global_state()[k].numpy() for k in shared_keys(server.network)])
    ins = strategy.fit_instructions(server_round=1 if task == "init" else 2, parameters=state)
    res = OrchestraClient(client_id=1).fit(ins)
    assert len(seen) == 1
    return res, seen[0]


@pytest.mark.parametrize("task", ["init", "train"])
def test_kanon_client_reply_contains_no_representation(tiny_config, monkeypatch, task):
    res, memory = client_round(tiny_config, "kanon", monkeypatch, task)
    assert memory.shape == (tiny_config.memory_size, tiny_config.projection_dim)
    assert leaked_rows(res, memory) == 0
    release = decode_release(res.metrics)
    assert release.num_vectors == tiny_config.num_local_centroids
    assert release.guarantee.k == tiny_config.memory_size // tiny_config.num_local_centroids


def test_the_check_catches_a_mechanism_that_leaks(tiny_config, monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", {**registry._REGISTRY, "leaky-test": LeakyMechanism})
    res, memory = client_round(tiny_config.replace(mechanism="leaky-test"), "leaky-test", monkeypatch, "train")
    assert leaked_rows(res, memory) == len(memory)


def test_reply_carries_a_delta_only_after_round_zero(tiny_config, monkeypatch):
    init, _ = client_round(tiny_config, "kanon", monkeypatch, "init")
    assert parameters_to_ndarrays(init.parameters) == []
    trained, _ = client_round(tiny_config, "kanon", monkeypatch, "train")
    assert len(parameters_to_ndarrays(trained.parameters)) == len(
        shared_keys(OrchestraNetwork(tiny_config.backbone, tiny_config.projection_dim))
    )
