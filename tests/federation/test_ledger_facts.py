"""The server's ledger records what the server charged, never the guarantee text a client sent.

A client's reply carries its own guarantee (kind, statement, k, epsilon,
delta); the checks keep its kind and credit a k, but the rest is the
client's word. Replies go through the real strategy into a real driver,
which writes ``ledger.jsonl``.
"""

from __future__ import annotations

import json

import pytest

from tests.federation.honest_round import NODE_OFFSET, Node
from tests.federation.test_failing_rounds import driven_round
from tests.federation.test_strategy import weights_of, with_metrics


def claiming(res, **claims):
    """``res`` with its guarantee's fields replaced by ``claims``."""
    guarantee = {**json.loads(res.metrics["release_guarantee"]), **claims}
    return with_metrics(res, release_guarantee=json.dumps(guarantee))


def ledger_lines(driver) -> list[dict]:
    return [json.loads(line) for line in (driver.run_dir.path / "ledger.jsonl").read_text().splitlines()]


@pytest.fixture
def config(tiny_config):
    return tiny_config.replace(secagg=False, rounds=2, num_global_centroids=8)


def test_a_kanon_entry_holds_the_credited_k_and_the_servers_words(config, tmp_path):
    round_, driver = driven_round(config, tmp_path / "run")
    lying = claiming(round_.reply(1), epsilon=-5.0, delta=3.0, statement="x" * 90_000)
    round_.strategy.aggregate_fit(1, [(Node(NODE_OFFSET), round_.reply(0)), (Node(NODE_OFFSET + 1), lying)], [])
    (record,) = driver.run_dir.metrics()
    assert record["rejected_replies"] == 0  # the claims are not checkable, so the reply is accepted...
    lines = ledger_lines(driver)
    assert [line["client"] for line in lines] == [0, 1]
    honest, liar = (line["guarantee"] for line in lines)
    assert liar == honest | {"k": liar["k"]}  # ...but the ledger records none of them
    assert liar["kind"] == "k-anonymity" and liar["epsilon"] is None and liar["delta"] is None
    assert len(liar["statement"]) < 300 and "credits" in liar["statement"]
    claimed_k, lightest = json.loads(lying.metrics["release_guarantee"])["k"], int(weights_of(lying).min())
    assert liar["k"] == min(claimed_k, lightest) and driver.ledger.min_k == min(honest["k"], liar["k"])


def test_an_ldp_entry_holds_the_plans_epsilon_not_the_clients(config, tmp_path):
    round_, driver = driven_round(config.replace(mechanism="ldp", epsilon=4.0), tmp_path / "run")
    lying = claiming(round_.reply(0), epsilon=1e-9, k=10**6, statement="perfectly private")
    round_.strategy.aggregate_fit(1, [(Node(NODE_OFFSET), lying), (Node(NODE_OFFSET + 1), round_.reply(1))], [])
    lines = ledger_lines(driver)
    assert [line["client"] for line in lines] == [0, 1]
    for line in lines:
        guarantee = line["guarantee"]
        assert guarantee["epsilon"] == driver.plan.privacy.epsilon_per_release and guarantee["delta"] == driver.plan.privacy.delta
        assert guarantee["k"] is None and guarantee["statement"].startswith("Accepted; charged the planned events")
    assert lines[0]["events"] == lines[1]["events"]
