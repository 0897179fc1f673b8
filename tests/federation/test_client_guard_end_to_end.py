"""Under Flower's simulation, a node refuses a server's weakened parameters and the run goes on without it.

The "malicious server" is an outer mod that adds a halved ``ldp`` sum noise
to every fit message to one node, as a server that sent parameters would;
nothing inside the client is patched. The other nodes' own ledgers must agree with
the server's ledger.
"""

from __future__ import annotations

import json

import pytest
from flwr.app.message_type import MessageType

from privfed.config import build_config
from privfed.federation.client_app import FIT_CONFIG_RECORD
from privfed.federation.simulation import simulate
from privfed.privacy.client_guard import ClientGuard, declared_budget
from privfed.privacy.ledger import RELEASES, LedgerEntry, PrivacyLedger
from privfed.run.plan import plan_run

TAMPERED = 0


def halve_the_noise_for_one_node(msg, context, call_next):
    """Outer mod: what a server that weakens one node's noise would send it."""
    fit = msg.content.config_records.get(FIT_CONFIG_RECORD)
    tampered = int(context.node_config["partition-id"]) == TAMPERED
    if msg.metadata.message_type == MessageType.TRAIN and fit is not None and tampered:
        fit["mechanism_params"] = json.dumps({"sum_noise_multiplier": 0.5})
    return call_next(msg, context)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("guard")
    config = build_config(
        dataset="shapes:300", num_clients=6, participation=0.5, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=3, seed=1, device="cpu",
        mechanism="ldp", epsilon=2.0, out=str(folder / "run"),
    )
    plan = plan_run(config)
    summary = simulate(plan, outer_mods=[halve_the_noise_for_one_node])
    metrics = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    return plan, summary, metrics


def test_the_run_goes_on_without_the_node_that_refused(run):
    plan, summary, metrics = run
    assert summary["rounds"] == plan.config.rounds
    sampled_tampered = [m for m in metrics if TAMPERED in m["sampled_clients"]]
    assert sampled_tampered, "seed 1 must sample the tampered node at least once"
    assert all(m["client_failures"] == 1 and m["clients_completed"] == 2 for m in sampled_tampered)
    # The others' updates still reach the model through SecAgg+ in the rounds it refused.
    assert all("secagg_halted" not in m for m in sampled_tampered if m["task"] == "train")


def test_the_refusing_node_is_charged_nothing_and_the_others_ledgers_agree_with_the_servers(run):
    plan, _, _ = run
    server = PrivacyLedger.resume(plan.run_dir.path / "ledger.jsonl", mechanism="ldp", delta=plan.privacy.delta,
                                  reference_epsilon=plan.config.epsilon)
    ledgers = plan.run_dir.client_ledgers
    assert not (ledgers / f"privfed-ledger-partition-{TAMPERED}.jsonl").exists()
    assert server.releases(TAMPERED) == 0
    checked = 0
    for partition in range(plan.config.num_clients):
        path = ledgers / f"privfed-ledger-partition-{partition}.jsonl"
        if partition == TAMPERED or not path.exists():
            continue
        own = ClientGuard(declared_budget(plan.config, plan.client_sizes[partition]), path)
        assert own.ledger.releases(0) == server.releases(partition)
        assert own.spent(RELEASES) == pytest.approx(server.spent(partition, RELEASES), rel=1e-9)
        checked += 1
    assert checked >= 2


def test_a_ledger_entry_reads_back_as_written(run):
    plan, _, _ = run
    line = (plan.run_dir.path / "ledger.jsonl").read_text().splitlines()[0]
    assert LedgerEntry.from_dict(json.loads(line)).to_dict() == json.loads(line)
