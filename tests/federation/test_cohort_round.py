"""The local runtime with clients trained together: same seed, same run; a refused client is neither trained nor charged.

``clients_per_step=3`` batches on the CPU too (the automatic setting
batches only on CUDA). The batched computation itself is checked against
the per-client one in ``tests/orchestra/test_cohort_training.py``.
"""

from __future__ import annotations

import json
import logging

import pytest
from flwr.app.message_type import MessageType

from privfed.config import build_config
from privfed.federation.client_app import FIT_CONFIG_RECORD
from privfed.federation.local_runtime import cohort_of
from privfed.federation.simulation import simulate
from privfed.run.plan import plan_run
from tests.run_records import jsonl

TIMINGS = ("round_seconds", "elapsed_seconds", "train_seconds", "release_seconds")
TAMPERED = 0


def _config(folder, name: str, **changes):
    settings = dict(
        dataset="shapes:300", num_clients=6, participation=0.5, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=2, seed=3, device="cpu",
        clients_per_step=3, out=str(folder / name),
    )
    return build_config(**{**settings, **changes})


def _metrics(folder, name: str) -> list[dict]:
    return [{k: v for k, v in record.items() if k not in TIMINGS} for record in jsonl(folder / name / "metrics.jsonl")]


def test_the_same_seed_gives_the_same_metrics_with_clients_trained_together(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="privfed.federation.cohort_round"):
        for name in ("a", "b"):
            simulate(plan_run(_config(tmp_path, name)))
    assert _metrics(tmp_path, "a") == _metrics(tmp_path, "b")
    together = [r for r in caplog.records if "trained together" in r.getMessage()]
    assert len(together) == 4  # 2 training rounds, twice


def halve_the_noise_for_one_node(msg, context, call_next):
    """Outer mod: a server that weakens one node's ldp noise; that node's guard refuses the round."""
    fit = msg.content.config_records.get(FIT_CONFIG_RECORD)
    if msg.metadata.message_type == MessageType.TRAIN and fit is not None and int(context.node_config["partition-id"]) == TAMPERED:
        fit["mechanism_params"] = json.dumps({"sum_noise_multiplier": 0.5})
    return call_next(msg, context)


def test_a_client_its_guard_refuses_in_a_batched_round_is_neither_trained_nor_charged(tmp_path, caplog):
    config = _config(tmp_path, "run", mechanism="ldp", epsilon=2.0, num_clients=4, participation=1.0, seed=1)
    plan = plan_run(config)
    with caplog.at_level(logging.INFO, logger="privfed.federation.cohort_round"):
        summary = simulate(plan, outer_mods=[halve_the_noise_for_one_node])
    assert summary["rounds"] == config.rounds
    trained = [r.getMessage() for r in caplog.records if "trained together" in r.getMessage()]
    assert trained == [f"round {r}: partitions [1, 2, 3] trained together" for r in (1, 2)]
    assert not (plan.run_dir.client_ledgers / f"privfed-ledger-partition-{TAMPERED}.jsonl").exists()
    for partition in (1, 2, 3):  # charged once per round, in the first pass only
        entries = (plan.run_dir.client_ledgers / f"privfed-ledger-partition-{partition}.jsonl").read_text().splitlines()
        rounds = [json.loads(line)["round"] for line in entries]
        assert sorted(rounds) == sorted(set(rounds)) and {1, 2} <= set(rounds)


@pytest.mark.parametrize(
    ("changes", "slots"),
    [
        ({"clients_per_step": 0}, None), ({"clients_per_step": 1}, None), ({"clients_per_step": 4}, 4),
        ({"clients_per_step": 4, "method": "supervised"}, None), ({"clients_per_step": 4, "dp_sgd": True}, None),
    ],
)
def test_clients_train_together_when_asked_or_on_cuda_and_only_when_the_method_can(tmp_path, changes, slots):
    settings = {"device": "cpu", **changes}
    cohort = cohort_of(_config(tmp_path, "x", **settings))
    assert (cohort().slots if cohort is not None else None) == slots
