"""The strategy's aggregation: FedAvg of plaintext deltas, or the decoded secure aggregate."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

from mechanisms import Guarantee, Release
from privfed.federation.client_config import ClientConfig
from privfed.federation.messages import encode_release
from privfed.federation.strategy import OrchestraStrategy
from privfed.federation.update_encoding import encode_metrics, encode_update
from privfed.methods import get_method
from privfed.models import OrchestraNetwork
from privfed.orchestra.model_state import shared_state, state_delta
from privfed.orchestra.server import OrchestraServer
from privfed.secagg_settings import secagg_settings


def reply(arrays: list[np.ndarray], num_examples: int, client: int) -> FitRes:
    vectors = F.normalize(torch.randn(4, 16, generator=torch.Generator().manual_seed(client)), dim=1)
    release = Release(vectors, torch.full((4,), 2.0), Guarantee(kind="none", statement="test"))
    metrics = {"client_id": client, **encode_release(release)}
    return FitRes(Status(Code.OK, "ok"), ndarrays_to_parameters(arrays), num_examples, metrics)


def strategy_in_a_training_round(config, secagg: bool) -> OrchestraStrategy:
    config = config.replace(secagg=secagg, projection_dim=16)
    server = OrchestraServer(OrchestraNetwork("resnet8", 16), num_global_centroids=8, seed=0)
    server.initialised = True
    server.centroids = F.normalize(torch.randn(8, 16), dim=1)
    rounds: list = []
    strategy = OrchestraStrategy(
        server, ClientConfig.of(config), rounds.append, clients_per_round=2, seed=config.seed,
        secagg=secagg_settings(config, [30, 10]),
    )
    strategy._sampled_ids = (0, 1)
    return strategy


def strategy_rounds(strategy: OrchestraStrategy) -> list:
    """The round reports the strategy handed to its hook (a list's ``append``)."""
    return strategy.on_round_end.__self__


def test_without_secagg_the_strategy_forms_fedavg_of_the_deltas(tiny_config):
    strategy = strategy_in_a_training_round(tiny_config, secagg=False)
    start = shared_state(strategy.server.network)
    ones = [np.ones_like(v.numpy()) for v in start.values()]
    threes = [3 * a for a in ones]
    strategy.aggregate_fit(2, [(None, reply(ones, 30, 0)), (None, reply(threes, 10, 1))], [])
    for key, moved in state_delta(shared_state(strategy.server.network), start).items():
        assert torch.allclose(moved, torch.full_like(moved, 1.5)), key


def test_with_secagg_the_strategy_decodes_the_one_aggregate(tiny_config):
    strategy = strategy_in_a_training_round(tiny_config, secagg=True)
    start = shared_state(strategy.server.network)
    delta = [np.full(v.shape, 1.5) for v in start.values()]
    scales = strategy.scales.copy()
    # SecAgg+ hands every reply the same weighted mean of the encoded updates; here both clients sent `delta`.
    aggregate = [*encode_update(delta, scales, weight_ratio=1.0, clipping_range=8.0),
                 encode_metrics({"loss": 3.0, "target_entropy": 0.5}, clipping_range=8.0)]
    strategy.aggregate_fit(2, [(None, reply(aggregate, 30, 0)), (None, reply(aggregate, 10, 1))], [])
    for key, moved in state_delta(shared_state(strategy.server.network), start).items():
        assert torch.allclose(moved, torch.full_like(moved, 1.5), atol=1e-6), key
    assert np.array_equal(strategy.scales, scales)  # nothing came near the clipping range
    (report,) = strategy_rounds(strategy)
    assert report.server_stats["loss"] == pytest.approx(3.0) and report.server_stats["target_entropy"] == pytest.approx(0.5)
    assert "rotation_loss" not in report.server_stats  # no client reported it


def test_a_release_the_method_does_not_make_is_refused(tiny_config):
    config = tiny_config.replace(method="rotpred", secagg=False, projection_dim=16)
    server = OrchestraServer(OrchestraNetwork("resnet8", 16), num_global_centroids=8, seed=0, method=get_method("rotpred"))
    strategy = OrchestraStrategy(server, ClientConfig.of(config), [].append, clients_per_round=2, seed=0)
    strategy._sampled_ids = (0, 1)
    with pytest.raises(RuntimeError, match=r"clients \[1\] sent releases, but method rotpred makes none"):
        strategy.aggregate_fit(1, [(None, reply([], 30, 1))], [])
    assert not server.initialised  # the round was not applied
