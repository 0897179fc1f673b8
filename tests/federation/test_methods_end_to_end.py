"""The ablations run through the same Flower pipeline as Orchestra and say what they did in summary.json.

Slow (two simulations): the fast tests cover the parts (tests/orchestra/test_server.py draws and keeps
the fixed centroids, tests/federation/test_strategy.py refuses a release from rotpred) and
tests/federation/test_baselines_end_to_end.py runs the no-release path for the baselines.
"""

from __future__ import annotations

import json

import pytest
import torch

from privfed.federation.simulation import simulate
from privfed.run.plan import plan_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from privfed.config import build_config

    root = tmp_path_factory.mktemp("methods")
    summaries = {}
    for method in ("rotpred", "orchestra-fixed-centroids"):
        config = build_config(
            dataset="shapes:200", num_clients=4, participation=0.5, rounds=2, local_epochs=1, batch_size=16,
            memory_size=32, num_local_centroids=4, num_global_centroids=8, projection_dim=16, eval_every=1,
            method=method, out=str(root / method), seed=0, report_client_metrics=True,
        )
        summaries[method] = (simulate(plan_run(config)), root / method)
    return summaries


@pytest.mark.parametrize("method", ["rotpred", "orchestra-fixed-centroids"])
def test_a_method_that_releases_nothing_trains_and_says_so(runs, method):
    summary, run_dir = runs[method]
    assert summary["method"]["name"] == method and summary["rounds"] == 2
    assert summary["mechanism"]["name"] is None and summary["privacy"]["mechanism"] is None
    assert summary["privacy"]["statement"].startswith("No guarantee: the method runs no release mechanism")
    ledger = run_dir / "ledger.jsonl"
    assert not ledger.exists() or ledger.read_text() == ""  # nothing was released, nothing charged
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["task"] for r in records] == ["init", "train", "train"]
    assert all("released_vectors" not in r for r in records)
    trained = records[1:]
    assert all(r["rotation_loss"] > 0 and r["knn_accuracy"] is not None for r in trained)
    if method == "rotpred":
        assert all(r["cluster_loss"] == 0 and r["target_entropy"] is None for r in trained)
    else:
        assert all(r["cluster_loss"] > 0 and 0 < r["target_entropy"] <= 1 for r in trained)


def test_the_fixed_centroids_are_the_ones_drawn_in_round_zero(runs):
    _, run_dir = runs["orchestra-fixed-centroids"]
    final = torch.load(run_dir / "checkpoints" / "final.pt", weights_only=False)
    centroids = final["centroids"]
    assert centroids.shape == (8, 16)
    # Drawn from the server's seeded generator before any release could exist.
    expected = torch.nn.functional.normalize(torch.randn(8, 16, generator=torch.Generator().manual_seed(0)), dim=1)
    assert torch.allclose(centroids, expected)
