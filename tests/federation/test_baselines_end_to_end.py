"""The paper's baselines run through the same Flower pipeline, under SecAgg+, and say in summary.json that they release nothing.

Slow: one simulation per baseline (about 30 s each on two cores).
"""

from __future__ import annotations

import json

import pytest

from privfed.config import build_config
from privfed.federation.simulation import simulate
from privfed.run.plan import plan_run


@pytest.mark.slow
@pytest.mark.parametrize("method", ["simclr", "simsiam", "byol", "specloss", "supervised"])
def test_a_baseline_trains_under_secagg_and_releases_nothing(tmp_path, method):
    config = build_config(
        dataset="shapes:200", num_clients=4, participation=0.5, rounds=2, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, projection_dim=16, eval_every=1,
        method=method, out=str(tmp_path / method), seed=0, report_client_metrics=True,  # the losses, as round means
    )
    summary = simulate(plan_run(config))
    assert summary["method"] == {**summary["method"], "name": method, "loss": method, "releases": False}
    assert summary["mechanism"]["name"] is None
    assert summary["privacy"]["statement"].startswith("No guarantee: the method runs no release mechanism")
    settings = summary["secure_aggregation"]
    assert settings["enabled"] and settings["halted_rounds"] == 0
    records = [json.loads(line) for line in (tmp_path / method / "metrics.jsonl").read_text().splitlines()]
    assert [r["task"] for r in records] == ["init", "train", "train"]
    trained = records[1:]
    assert all(r["loss"] is not None and r["knn_accuracy"] is not None for r in trained)
    assert all("released_vectors" not in r and r["target_entropy"] is None for r in trained)
    ledger = tmp_path / method / "ledger.jsonl"
    assert not ledger.exists() or ledger.read_text() == ""
