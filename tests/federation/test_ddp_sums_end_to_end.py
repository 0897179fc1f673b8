"""``privfed train --mechanism ddp-sums``: shares summed under SecAgg+, charged and stated with the trust they need."""

from __future__ import annotations

import json

import pytest

from privfed.data.federated import FederatedSplit
from privfed.privacy.budget import plan_privacy
from privfed.run.directory import RunDirectory

TINY = (
    "--dataset", "shapes:300", "--num-clients", "4", "--participation", "1.0", "--projection-dim", "16",
    "--local-epochs", "1", "--batch-size", "16", "--memory-size", "32", "--num-local-centroids", "4",
    "--num-global-centroids", "8", "--rounds", "2", "--device", "cpu", "--seed", "1",
)


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory, run_privfed):
    out = tmp_path_factory.mktemp("ddp") / "run"
    result = run_privfed("train", *TINY, "--mechanism", "ddp-sums", "--epsilon", "10", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_every_training_round_combines_a_secure_sum_of_every_clients_share(run):
    summary = json.loads((run / "summary.json").read_text())
    assert summary["secure_aggregation"]["enabled"] and summary["secure_aggregation"]["halted_rounds"] == 0
    metrics = lines(run / "metrics.jsonl")
    assert [m["clients_completed"] for m in metrics] == [4, 4, 4]
    assert "moved_centroid_fraction" not in metrics[0]  # round 0: random centroids, no sum
    assert all(m["clients"] == 4 and m["moved_centroid_fraction"] > 0 for m in metrics[1:])


def test_the_server_and_every_client_charge_what_the_plan_says_from_round_1(run):
    config = RunDirectory(run).config()
    plan = plan_privacy(config, FederatedSplit.of(config).client_sizes())
    planned = [{"name": e.name, "params": e.params} for e in plan.per_release_events]
    assert plan.max_releases == 2 and plan.params["min_shares"] == 3  # no release in round 0; SecAgg+'s threshold
    server = [e for e in lines(run / "ledger.jsonl") if e["kind"] == "release"]
    assert sorted((e["round"], e["client"]) for e in server) == [(r, c) for r in (1, 2) for c in range(4)]
    assert all(e["events"] == planned for e in server)
    for client in range(4):
        own = [e for e in lines(run / "client-ledgers" / f"privfed-ledger-partition-{client}.jsonl") if e["kind"] == "release"]
        assert [e["round"] for e in own] == [1, 2] and all(e["events"] == planned for e in own)


def test_the_statement_names_epsilon_and_the_trust_it_rests_on(run):
    privacy = json.loads((run / "summary.json").read_text())["privacy"]
    assert privacy["mechanism"] == "ddp-sums" and 9.9 <= privacy["epsilon"] <= 10.0 * (1 + 1e-9)
    statement = privacy["statement"]
    # A share alone holds only part of the noise: the claim is for the sums the server sees.
    assert statement.startswith("Over the whole run, the secure sums of the clients' shares")
    assert "sees only the secure sum" in statement and "at least 3 clients" in statement
    assert "colludes with clients" in statement


def test_ddp_sums_without_secagg_is_refused_before_training(tmp_path, run_privfed):
    result = run_privfed("train", *TINY, "--mechanism", "ddp-sums", "--epsilon", "10", "--no-secagg",
                         "--out", str(tmp_path / "run"))
    assert result.returncode != 0 and "--no-secagg" in result.stderr + result.stdout
    assert not (tmp_path / "run" / "ledger.jsonl").exists()
