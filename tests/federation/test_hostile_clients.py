"""Under Flower's simulation, with SecAgg+, the server drops a hostile client's reply and the run goes on.

The hostile client is an outer mod that spoils one node's reply on its way
to the server, as a buggy or malicious client would send it; nothing on the
server is patched. In round 0 (plain fit) client 2 claims another client's
id; in round 1 (SecAgg+) client 3 releases NaN vectors, so the server must
halt the round (leaving its masked vector out would expose it). The mechanism is
``ldp``, so the ledger shows whether a rejected reply's cost is charged.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from flwr.common import bytes_to_ndarray, ndarray_to_bytes

from privfed.config import build_config
from privfed.federation.simulation import simulate
from privfed.privacy.ledger import LedgerEntry
from privfed.run.plan import plan_run

pytestmark = pytest.mark.slow  # a SecAgg+ simulation; the fuzz cases run by default in test_strategy.py

FIT_METRICS = "fitres.metrics"  # where a fit reply's metrics travel in Flower's message
SPOILT = {0: 2, 1: 3}  # Orchestra round -> the client whose reply is spoilt


def spoil_one_reply_per_round(msg, context, call_next):
    """Outer mod: round 0's client 2 claims to be client 0; round 1's client 3 sends NaN centroids."""
    reply = call_next(msg, context)
    metrics = None if reply.has_error() else reply.content.config_records.get(FIT_METRICS)
    if metrics is None or "release_vectors" not in metrics:
        return reply
    client, round_index = int(context.node_config["partition-id"]), int(msg.metadata.group_id) - 1
    if SPOILT.get(round_index) != client:
        return reply
    if round_index == 0:
        metrics["client_id"] = 0
    else:
        vectors = bytes_to_ndarray(metrics["release_vectors"]).copy()
        vectors[0, 0] = np.nan
        metrics["release_vectors"] = ndarray_to_bytes(vectors)
    return reply


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    config = build_config(
        dataset="shapes:320", num_clients=4, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=1, seed=0, device="cpu",
        mechanism="ldp", epsilon=4.0, out=str(folder / "run"),
    )
    plan = plan_run(config)
    summary = simulate(plan, outer_mods=[spoil_one_reply_per_round])
    metrics = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    ledger = [LedgerEntry.from_dict(json.loads(line)) for line in (folder / "run" / "ledger.jsonl").read_text().splitlines()]
    return plan, summary, metrics, ledger


def test_each_spoilt_reply_is_rejected_with_its_reason_and_the_run_goes_on(run):
    plan, summary, metrics, _ = run
    assert summary["rounds"] == plan.config.rounds and summary["stopped_early"] is None
    rejected = summary["rejected_replies"]
    assert rejected["count"] == 2
    first, second = rejected["replies"]
    assert (first["round"], first["client"]) == (0, 2) and "not the partition 2" in first["reason"]
    assert (second["round"], second["client"]) == (1, 3) and "NaN or Inf" in second["reason"]
    for record in metrics:
        assert record["rejected_replies"] == 1 and record["clients_completed"] == 3
    # Round 0 is plain: the round goes on with the others. Round 1 is SecAgg+: the rejection halts it.
    assert summary["secure_aggregation"]["enabled"] and summary["secure_aggregation"]["halted_rounds"] == 1
    assert "secagg_halted" not in metrics[0] and metrics[1]["secagg_halted"] == 1
    assert math.isfinite(summary["knn_accuracy"])


def test_a_rejected_reply_is_still_charged_as_planned_and_nothing_twice(run):
    plan, _, _, ledger = run
    charged = [(entry.client, entry.round) for entry in ledger]
    assert sorted(charged) == sorted((c, r) for r in range(plan.config.rounds + 1) for c in range(4))
    assert all(entry.events == plan.privacy.per_release_events for entry in ledger)
    spoilt = {(entry.client, entry.round): entry for entry in ledger}
    assert "rejected" in spoilt[(2, 0)].guarantee.statement and "rejected" in spoilt[(3, 1)].guarantee.statement
