"""Rounds that go wrong end cleanly: no crash from empty releases, huge finite metrics or all-rejected replies.

Each test drives the real strategy, built by the server app around a real
:class:`privfed.run.driver.RunDriver`, with real client replies; only the
Flower runtime is left out (the sampled clients are set by hand).
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from privfed.errors import PrivfedError
from privfed.federation.server_app import build_strategy
from privfed.run.directory import RunDirectory
from privfed.run.driver import RunDriver
from privfed.run.plan import plan_resume, plan_run
from privfed.run.resume import read_resume_point
from tests.federation.honest_round import NODE_OFFSET, HonestRound, Node
from tests.federation.test_strategy import with_metrics


def driven_round(config, out, sampled: tuple[int, ...] = (0, 1)) -> tuple[HonestRound, RunDriver]:
    """Round 0 of a planned run: the strategy the server app builds, reporting to a started driver."""
    plan = plan_run(config.replace(out=str(out)))
    driver = RunDriver(plan)
    strategy = build_strategy(plan, driver, {NODE_OFFSET + p: p for p in range(config.num_clients)})
    strategy._sampled_ids = sampled
    return HonestRound(plan, strategy, server_round=1), driver


@pytest.fixture
def config(tiny_config):
    return tiny_config.replace(secagg=False, rounds=2, num_global_centroids=8)


def test_a_round_0_where_every_release_is_empty_sets_random_centroids(config, tmp_path):
    """Honest kanon clients with fewer than min_k images release nothing (privfed train --num-clients 40
    --participation 0.05 --seed 3 crashed in torch.cat on such a round)."""
    # Clients 0 and 2 hold 75 and 36 images, fewer than k = 80; client 1's 99 could release (else the plan refuses).
    round_, driver = driven_round(config.replace(kanon_min_k=80, memory_size=128), tmp_path / "run", sampled=(0, 2))
    replies = [(Node(NODE_OFFSET + c), round_.reply(c)) for c in (0, 2)]
    round_.strategy.aggregate_fit(1, replies, [])
    centroids = round_.strategy.server.centroids
    assert centroids.shape == (8, 16) and torch.allclose(centroids.norm(dim=1), torch.ones(8))
    (record,) = driver.run_dir.metrics()
    assert record["clients_completed"] == 2 and record["released_vectors"] == 0.0
    assert "centroid_usage" not in record  # no released vector to be nearest to anything
    assert round_.strategy.stop_reason is None  # the run goes on: round 1 trains against these centroids


def test_huge_finite_metrics_do_not_overflow_the_rounds_mean(config, tmp_path):
    """Round 0's metrics travel in plaintext even under SecAgg+: two colluding clients could end a run."""
    round_, driver = driven_round(config.replace(report_client_metrics=True), tmp_path / "run")
    huge = {"release_seconds": 1.7e308, "train_seconds": -1.7e308}
    replies = [(Node(NODE_OFFSET + c), with_metrics(round_.reply(c), **huge)) for c in (0, 1)]
    round_.strategy.aggregate_fit(1, replies, [])
    (record,) = driver.run_dir.metrics()
    assert record["clients_completed"] == 2
    assert math.isfinite(record["release_seconds"]) and record["release_seconds"] > 1e299
    assert math.isfinite(record["train_seconds"]) and record["train_seconds"] < -1e299


def test_a_round_0_with_every_reply_rejected_stops_with_a_summary_that_says_why(config, tmp_path):
    round_, driver = driven_round(config, tmp_path / "run")
    replies = [(Node(NODE_OFFSET + c), with_metrics(round_.reply(c), client_id=None)) for c in (0, 1)]
    round_.strategy.aggregate_fit(1, replies, [])
    assert round_.strategy.configure_fit(2, None, None) == []  # no further round
    summary = driver.finish(secure_aggregation=round_.strategy.secure_aggregation_summary())
    on_disk = json.loads((driver.run_dir.path / "summary.json").read_text())
    assert on_disk["stopped_early"] == summary["stopped_early"]
    assert re.match(r"round 0: no usable reply \(0 failed, 2 rejected: client 0: client_id is missing", summary["stopped_early"])
    assert on_disk["rejected_replies"]["count"] == 2


def test_a_run_stopped_for_want_of_usable_replies_can_be_resumed(config, tmp_path):
    round_, driver = driven_round(config, tmp_path / "run")
    replies = [(Node(NODE_OFFSET + c), with_metrics(round_.reply(c), client_id=None)) for c in (0, 1)]
    round_.strategy.aggregate_fit(1, replies, [])
    driver.finish(secure_aggregation=round_.strategy.secure_aggregation_summary())
    plan, point = plan_resume(driver.run_dir.path, {})
    assert point.round == 0 and not point.initialised  # the resumed run initialises in its first round
    assert plan.config.rounds == config.rounds


def test_a_run_that_crashed_before_its_first_resume_point_is_refused_with_what_to_do(config, tmp_path):
    """A crash in round 0 leaves config.json and no resume point: --resume says to start again elsewhere."""
    _, driver = driven_round(config, tmp_path / "run")
    with pytest.raises(PrivfedError, match="start it again with another --out"):
        read_resume_point(RunDirectory(driver.run_dir.path))
