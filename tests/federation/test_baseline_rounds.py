"""A baseline's round through the real strategy and client: replies accepted, the model averaged, nothing released."""

from __future__ import annotations

import pytest
import torch

from privfed.config import build_config
from privfed.orchestra.model_state import shared_state, state_delta
from tests.federation.honest_round import Node, honest_round


@pytest.mark.parametrize("method", ["simclr", "simsiam", "byol", "specloss", "supervised"])
def test_the_strategy_averages_a_baselines_updates_and_records_no_release(tmp_path, method):
    config = build_config(
        dataset="shapes:300", num_clients=4, participation=0.5, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=1, secagg=False, seed=0, method=method,
        report_client_metrics=True,
    )
    round_ = honest_round(config, tmp_path / "run")
    start = shared_state(round_.strategy.server.network)
    replies = [(Node(100 + c), round_.reply(c)) for c in (0, 1)]
    round_.strategy.aggregate_fit(round_.server_round, replies, [])
    (report,) = round_.reports
    assert report.rejected == [] and report.releases == []
    assert len(report.client_metrics) == 2 and all("loss" in m for m in report.client_metrics)
    moved = state_delta(shared_state(round_.strategy.server.network), start)
    assert set(moved) == set(start) and any(v.abs().sum() > 0 for v in moved.values())
    assert not any(torch.isnan(v).any() for v in moved.values())
