"""``privfed train --dp-sgd``: a real run, its ledger and its combined guarantee."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation

from privfed.privacy.statement import rounded_up

TINY = (
    "--dataset", "shapes:240", "--num-clients", "3", "--participation", "1.0", "--alpha", "1.0",
    "--projection-dim", "16", "--local-epochs", "1", "--batch-size", "16", "--memory-size", "32",
    "--num-local-centroids", "4", "--num-global-centroids", "8", "--rounds", "2", "--device", "cpu",
)


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory, run_privfed):
    out = tmp_path_factory.mktemp("dp") / "run"
    result = run_privfed("train", *TINY, "--dp-sgd", "--mechanism", "ldp", "--epsilon", "4", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), ledger, result.stdout


def test_summary_states_the_combined_epsilon_delta(dp_run):
    summary, _, stdout = dp_run
    privacy = summary["privacy"]
    assert privacy["dp_sgd"]["noise_multiplier"] > 0 and privacy["dp_sgd"]["max_grad_norm"] == 1.0
    assert privacy["dp_sgd"]["epsilon"] <= privacy["dp_sgd"]["target_epsilon"] == 8.0
    assert privacy["releases_epsilon"] <= 4.0
    # Composed, not added: more than either part, less than their sum.
    assert max(privacy["dp_sgd"]["epsilon"], privacy["releases_epsilon"]) < privacy["epsilon"]
    assert privacy["epsilon"] < privacy["dp_sgd"]["epsilon"] + privacy["releases_epsilon"]
    stated = f"({rounded_up(privacy['epsilon'], 3)}, {rounded_up(privacy['delta'], 2)})"
    assert stated in privacy["statement"] and f"{stated}-DP" in privacy["headline"]
    assert "training example" in privacy["statement"] and privacy["not_covered"]
    assert privacy["covers"] == [
        "model updates: DP-SGD, in the epsilon, per training example replaced by another (replace-one), amplified by "
        "secret Poisson batches",
        "released centroids: in the epsilon, per training example replaced by another (replace-one)",
    ]
    assert "DP-SGD" in stdout


def test_the_ledger_holds_every_dp_sgd_round_and_recomposes_to_the_summary(dp_run):
    summary, ledger, _ = dp_run
    worst = summary["privacy"]["worst_case_client"]
    training = [e for e in ledger if e["kind"] == "dp_sgd"]
    assert sorted({(e["client"], e["round"]) for e in training}) == [(c, r) for c in range(3) for r in (1, 2)]
    # Recompose the worst client's whole history by hand, with dp_accounting's own events.
    events = []
    for entry in (e for e in ledger if e["client"] == worst):
        for event in entry["events"]:
            p = event["params"]
            if event["name"] == "poisson_gaussian":
                inner = dp_event.PoissonSampledDpEvent(p["sampling_rate"], dp_event.GaussianDpEvent(p["noise_multiplier"]))
                events.append(dp_event.SelfComposedDpEvent(inner, int(p["count"])))
    accountant = pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4)
    accountant.compose(dp_event.ComposedDpEvent(events))
    assert accountant.get_epsilon(summary["privacy"]["delta"]) == pytest.approx(summary["privacy"]["dp_sgd"]["epsilon"], rel=0.02)


def test_dp_sgd_clients_report_no_losses(dp_run):
    summary, _, _ = dp_run
    metrics_file = summary["run_dir"] + "/metrics.jsonl"
    rounds = [json.loads(line) for line in Path(metrics_file).read_text().splitlines()]
    assert all(r.get("loss") is None for r in rounds)
    assert summary["rounds"] == 2 and summary["secure_aggregation"]["enabled"]
