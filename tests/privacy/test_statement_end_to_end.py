"""A real run's ``summary.json`` headline quotes that run's (epsilon, delta), and follows its config."""

from __future__ import annotations

import json

from privfed.privacy.statement import HEADLINE_LIMIT, rounded_up

TINY = (
    "--dataset", "shapes:300", "--num-clients", "4", "--participation", "1.0", "--projection-dim", "16",
    "--local-epochs", "1", "--batch-size", "16", "--memory-size", "32", "--num-local-centroids", "4",
    "--num-global-centroids", "8", "--rounds", "1", "--device", "cpu", "--seed", "1", "--mechanism", "ldp",
)


def test_the_headline_quotes_the_runs_epsilon_and_delta_and_changes_with_the_budget(tmp_path, run_privfed):
    privacy = {}
    for epsilon, delta in ((2.0, 1e-6), (6.0, 1e-5)):
        out = tmp_path / f"eps{epsilon:g}"
        result = run_privfed("train", *TINY, "--epsilon", str(epsilon), "--delta", str(delta), "--out", str(out))
        assert result.returncode == 0, result.stdout + result.stderr
        privacy[epsilon] = json.loads((out / "summary.json").read_text())["privacy"]
    low, high = privacy[2.0], privacy[6.0]
    assert low["epsilon"] <= 2.0 * (1 + 1e-9) < high["epsilon"] <= 6.0 * (1 + 1e-9)
    for run in (low, high):
        stated = f"({rounded_up(run['epsilon'], 3)}, {rounded_up(run['delta'], 2)})-DP"
        assert stated in run["headline"] and len(run["headline"]) <= HEADLINE_LIMIT
        assert "replacing one of its representations (ldp, worst-off client)" in run["headline"]
    assert "1e-06)-DP" in low["headline"] and "1e-05)-DP" in high["headline"]
    # Everything but the numbers is the mode's: the same lists and link.
    assert low["headline"] != high["headline"]
    assert (low["covers"], low["not_covered"], low["details"]) == (high["covers"], high["not_covered"], high["details"])
    assert low["covers"] == ["released centroids: in the epsilon, per representation replaced by another (replace-one)"]
