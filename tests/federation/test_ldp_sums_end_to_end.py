"""``privfed train --mechanism ldp-sums``: a real run is budgeted, charged and stated like any DP mechanism's."""

from __future__ import annotations

import json

TINY = (
    "--dataset", "shapes:300", "--num-clients", "4", "--participation", "1.0", "--projection-dim", "16",
    "--local-epochs", "1", "--batch-size", "16", "--memory-size", "32", "--num-local-centroids", "4",
    "--num-global-centroids", "8", "--rounds", "2", "--device", "cpu", "--seed", "1",
)


def test_a_two_round_ldp_sums_run_spends_its_whole_budget_and_states_it(tmp_path, run_privfed):
    out = tmp_path / "run"
    result = run_privfed("train", *TINY, "--mechanism", "ldp-sums", "--epsilon", "10", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    privacy = json.loads((out / "summary.json").read_text())["privacy"]
    assert privacy["mechanism"] == "ldp-sums" and 9.9 <= privacy["epsilon"] <= 10.0 * (1 + 1e-9)
    assert "differentially private with respect to replacing one" in privacy["statement"]
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    releases = [e for e in ledger if e["kind"] == "release"]
    assert len(releases) == 4 * 3  # every client in rounds 0, 1 and 2
    # Unset, the secret sample is ldp-sums's default: memory_size / median client size, charged as subsampled Gaussians.
    config = json.loads((out / "config.json").read_text())
    assert config["secret_sample"] is None
    assert {e["events"][0]["name"] for e in releases} == {"poisson_gaussian"}
    rates = {e["events"][0]["params"]["sampling_rate"] for e in releases}
    assert len(rates) == 1 and 0 < rates.pop() < 1
    assert "secret Poisson sample, at rate" in privacy["statement"]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["clients_completed"] for m in metrics] == [4, 4, 4]
