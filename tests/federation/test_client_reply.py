"""What a client sends: under ``kanon`` no representation leaves the client.

The check decodes *everything* in the client's ``FitRes`` (every parameter
array and every bytes metric) and looks for any row equal, up to float error,
to a representation the client held. The ``reps`` baseline, which releases
its memory on purpose, shows the check can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import FitRes, bytes_to_ndarray, parameters_to_ndarrays

from mechanisms import registry
from privfed.federation.client import is_finite
from privfed.federation.messages import RELEASE_KEYS, has_release
from privfed.methods import build_network, get_method
from privfed.models import OrchestraNetwork
from privfed.orchestra.model_state import shared_keys
from tests.federation.honest_round import declared_client, decode_release, instructions


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
    config = config.replace(secagg=False)  # the plain reply: every array is the client's own
    ins = instructions(config, train=task == "train")
    res = declared_client(config).fit(ins)
    assert ins.config["task"] == task
    assert len(seen) == (1 if get_method(config.method).releases else 0)
    return res, seen[0] if seen else None


@pytest.mark.parametrize("task", ["init", "train"])
def test_kanon_client_reply_contains_no_representation(tiny_config, monkeypatch, task):
    res, memory = client_round(tiny_config, "kanon", monkeypatch, task)
    assert memory.shape == (tiny_config.memory_size, tiny_config.projection_dim)
    assert leaked_rows(res, memory) == 0
    release = decode_release(res.metrics)
    assert release.num_vectors == tiny_config.num_local_centroids
    assert release.guarantee.k == tiny_config.memory_size // tiny_config.num_local_centroids


@pytest.mark.parametrize("task", ["init", "train"])
def test_ldp_client_reply_contains_no_representation(tiny_config, monkeypatch, task):
    config = tiny_config.replace(mechanism="ldp", epsilon=1.0)
    res, memory = client_round(config, "ldp", monkeypatch, task)
    assert leaked_rows(res, memory) == 0
    release = decode_release(res.metrics)
    assert release.num_vectors == config.num_local_centroids
    assert torch.allclose(release.vectors.norm(dim=1), torch.ones(config.num_local_centroids), atol=1e-5)
    assert release.guarantee.kind == "differential-privacy" and release.events


def test_reps_releases_exactly_the_clients_memory_and_the_check_sees_it(tiny_config, monkeypatch):
    res, memory = client_round(tiny_config.replace(mechanism="reps"), "reps", monkeypatch, "train")
    release = decode_release(res.metrics)
    assert torch.equal(release.vectors, memory.float())
    assert torch.equal(release.weights, torch.ones(len(memory)))
    assert leaked_rows(res, memory) == len(memory)  # the check above would catch a leak


def test_reply_carries_a_delta_only_after_round_zero(tiny_config, monkeypatch):
    init, _ = client_round(tiny_config, "kanon", monkeypatch, "init")
    assert parameters_to_ndarrays(init.parameters) == []
    trained, _ = client_round(tiny_config, "kanon", monkeypatch, "train")
    assert len(parameters_to_ndarrays(trained.parameters)) == len(
        shared_keys(OrchestraNetwork(tiny_config.backbone, tiny_config.projection_dim))
    )


@pytest.mark.parametrize("task", ["init", "train"])
@pytest.mark.parametrize("method", ["rotpred", "orchestra-fixed-centroids"])
def test_a_method_that_does_not_cluster_sends_no_release(tiny_config, monkeypatch, task, method):
    res, memory = client_round(tiny_config.replace(method=method), "kanon", monkeypatch, task)
    assert memory is None  # the mechanism never ran
    assert not has_release(res.metrics)
    assert (len(parameters_to_ndarrays(res.parameters)) > 0) == (task == "train")


def test_a_failed_round_tells_the_server_nothing_about_the_clients_data(tiny_config, caplog):
    """Flower sends an exception's text to the server: a NaN count must stay on the client."""
    from privfed.federation.client import ClientRoundFailed

    state = build_network(tiny_config).state_dict()
    poisoned = {k: (torch.full_like(v, float("nan")) if k.startswith("target.") and v.is_floating_point() else v)
                for k, v in state.items()}
    ins = instructions(tiny_config, train=False, state=poisoned)
    with pytest.raises(ClientRoundFailed) as failure:
        declared_client(tiny_config).fit(ins)
    assert not any(ch.isdigit() for ch in str(failure.value))
    assert "NaN or Inf" in caplog.text  # the reason is in the client's own log



def reply_to(config, task: str = "train") -> tuple[FitRes, int]:
    """The real client's reply to the real strategy's instructions, and how many tensors the update has."""
    res = declared_client(config).fit(instructions(config, train=task == "train"))
    return res, len(shared_keys(build_network(config)))


#: What every reply's metrics hold besides the release: who answers, which round, and the DP-SGD cost (none here).
PROTOCOL_KEYS = {"client_id", "round", "dp_sgd_events"}


@pytest.mark.parametrize("task", ["init", "train"])
@pytest.mark.parametrize("secagg", [True, False])
def test_by_default_a_reply_carries_no_training_metric_with_or_without_secagg(tiny_config, secagg, task):
    """Neither in plaintext nor in the masked sum: the reply is the update, its indicators and the release."""
    res, tensors = reply_to(tiny_config.replace(secagg=secagg), task)
    assert set(res.metrics) - set(RELEASE_KEYS) == PROTOCOL_KEYS
    arrays = parameters_to_ndarrays(res.parameters)
    if task == "init":
        assert arrays == []
    elif secagg:  # the encoded update, then the overflow and high indicators, and nothing after them
        assert len(arrays) == tensors + 2 and arrays[-1].shape == arrays[-2].shape == (tensors,)
        raised = set(np.unique(np.concatenate(arrays[-2:]))) - {0.0}
        assert len(raised) <= 1 and all(v >= 1 for v in raised)  # flags: 0, or 1 over the client's weight ratio
    else:
        assert len(arrays) == tensors


def test_with_report_client_metrics_the_losses_travel_in_the_masked_sum_under_secagg(tiny_config):
    from privfed.secagg.encoding import SECURE_METRIC_SCALES

    res, tensors = reply_to(tiny_config.replace(secagg=True, report_client_metrics=True))
    assert set(res.metrics) - set(RELEASE_KEYS) == PROTOCOL_KEYS  # nothing in plaintext
    arrays = parameters_to_ndarrays(res.parameters)
    assert len(arrays) == tensors + 3  # the update, two indicator vectors, the metrics
    names = list(SECURE_METRIC_SCALES)
    present = dict(zip(names, arrays[-1][1::2]))
    assert arrays[-1].shape == (2 * len(names),) and present["loss"] == present["steps"] == 1.0


def test_with_report_client_metrics_and_no_secagg_each_clients_losses_travel_in_plaintext(tiny_config):
    res, _ = reply_to(tiny_config.replace(secagg=False, report_client_metrics=True))
    assert res.metrics["loss"] > 0 and res.metrics["steps"] >= 1 and "target_entropy" in res.metrics


def test_under_secagg_a_value_the_masked_sum_has_no_slot_for_stays_home(tiny_config, monkeypatch):
    """A method (a plug-in's, say) may report a value of its own; under SecAgg+ it must not travel in plaintext.

    The client used to drop from its plaintext metrics only the names the masked sum encodes, so any other
    name went to the server in the clear, per client, in a SecAgg+ round.
    """
    import dataclasses

    from privfed.methods.orchestra import Orchestra

    step = Orchestra.step_on_views

    def with_own_value(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        return dataclasses.replace(out, values={**out.values, "own_value": out.loss.detach() * 0 + 42.0})

    monkeypatch.setattr(Orchestra, "step_on_views", with_own_value)
    res, _ = reply_to(tiny_config.replace(secagg=True, report_client_metrics=True))
    assert set(res.metrics) - set(RELEASE_KEYS) == PROTOCOL_KEYS


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_is_finite_finds_any_nan_or_inf_in_a_model_sized_delta(bad):
    """The client's check before sending is a min/max reduction: NaN and Inf must show wherever they sit."""
    values = torch.randn(1_000_003, generator=torch.Generator().manual_seed(0))
    assert is_finite(values) and is_finite(torch.empty(0)) and is_finite(torch.zeros(3, dtype=torch.int64))
    for position in (0, 1, 7, 8, 15, 16, 31, 32, 63, 500_001, 1_000_002):
        poisoned = values.clone()
        poisoned[position] = bad
        assert not is_finite(poisoned), position
        assert not is_finite(poisoned.view(1, -1).double()), position
