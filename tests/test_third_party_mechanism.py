"""A third-party DP mechanism, installed only through the entry point, is budgeted and described end to end.

The plugin (``examples/third_party_mechanism.py``) is never imported
by privfed's code nor registered with ``@register_mechanism``: a fake
installed distribution in ``tmp_path`` declares it in the
``privfed.mechanisms`` entry-point group, and the real ``privfed`` CLI runs
in a subprocess whose ``PYTHONPATH`` holds that distribution and the
plugin's folder. Flower's Ray workers inherit that environment, so the
simulated clients build the plugin from the same entry point.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation

from tests.plugin_env import PLUGIN_FOLDERS, installed_env, run_privfed

NAME = "gauss-cells"
ENTRY = f"{NAME} = third_party_mechanism:GaussianCellSums"
EPSILON = 3.0
ROUNDS = 2
NUM_CLIENTS = 4
TRAIN_ARGS = (
    "train", "--dataset", "shapes:300", "--num-clients", str(NUM_CLIENTS), "--participation", "1.0",
    "--projection-dim", "16", "--local-epochs", "1", "--batch-size", "16", "--memory-size", "32",
    "--num-local-centroids", "4", "--num-global-centroids", "8", "--rounds", str(ROUNDS),
    "--mechanism", NAME, "--no-secagg", "--device", "cpu",
)


def _load_plugin():
    """The plugin module, loaded from its file (this process does not register it anywhere)."""
    spec = importlib.util.spec_from_file_location("third_party_mechanism", PLUGIN_FOLDERS[0] / "third_party_mechanism.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    """An environment in which ``gauss-cells`` is installed, as far as ``importlib.metadata`` can tell."""
    return installed_env(tmp_path_factory.mktemp("site"), "fake-privfed-plugin", ENTRY)


def _independent_epsilon(events: list[dict], delta: float) -> float:
    """The events composed by dp_accounting directly (replace-one, fine grid), without privfed's helpers."""
    accountant = pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4)
    for event in events:
        assert event["name"] == "gaussian"
        gaussian = dp_event.GaussianDpEvent(noise_multiplier=event["params"]["noise_multiplier"])
        accountant.compose(gaussian, count=int(event["params"]["count"]))
    return float(accountant.get_epsilon(delta))


def test_plugin_is_listed_only_when_its_distribution_is_installed(plugin_env, tmp_path):
    listed = run_privfed(plugin_env, "mechanisms", cwd=tmp_path)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert any(line.split()[:1] == [NAME] for line in listed.stdout.splitlines()), listed.stdout
    assert "ldp" in listed.stdout  # the built-ins are still there
    without = run_privfed({k: v for k, v in plugin_env.items() if k != "PYTHONPATH"}, "mechanisms", cwd=tmp_path)
    assert without.returncode == 0 and NAME not in without.stdout  # it comes in through the entry point only


def test_third_party_dp_mechanism_is_budgeted_and_described_end_to_end(plugin_env, tmp_path):
    plugin = _load_plugin()
    out = tmp_path / "run"
    result = run_privfed(plugin_env, *TRAIN_ARGS, "--epsilon", str(EPSILON), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr

    config = json.loads((out / "config.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    delta = config["delta"]
    privacy = summary["privacy"]
    assert config["mechanism"] == NAME and summary["rounds"] == ROUNDS and not summary["stopped_early"]

    # The budget was planned by asking the plugin's class, and respected.
    assert summary["mechanism"]["name"] == NAME
    assert summary["mechanism"]["params"] == plugin.GaussianCellSums.calibrate(
        epsilon=EPSILON, delta=delta, num_releases=ROUNDS + 1
    )
    assert privacy["mechanism"] == NAME and privacy["budget"] == EPSILON and privacy["delta"] == delta
    assert 0 < privacy["epsilon"] <= EPSILON
    assert privacy["releases_epsilon"] == privacy["epsilon"]  # no DP-SGD: the releases are all there is

    # The statement describes it as a DP mechanism, per representation, without knowing its name.
    assert "differentially private with respect to replacing one of its representations" in privacy["statement"]
    assert f"released centroids ({NAME}): epsilon" in privacy["statement"]
    assert privacy["covers"] == ["released centroids: in the epsilon, per representation replaced by another (replace-one)"]
    assert privacy["details"] == "docs/privacy.md#statement-dp-releases" and "-DP w.r.t. replacing one" in privacy["headline"]
    assert "no guarantee" not in privacy["statement"].lower()

    # Every client released in every round (round 0 included), from the plugin the clients built.
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(m["clients_completed"], m["client_failures"]) for m in metrics] == [(NUM_CLIENTS, 0)] * (ROUNDS + 1)
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    assert sorted((e["client"], e["round"]) for e in ledger) == [
        (c, r) for c in range(NUM_CLIENTS) for r in range(ROUNDS + 1)
    ]
    expected_events = [
        {"name": e.name, "params": e.params}
        for e in plugin.GaussianCellSums(**summary["mechanism"]["params"]).privacy_events()
    ]
    for entry in ledger:
        assert entry["kind"] == "release" and entry["mechanism"] == NAME
        assert entry["events"] == expected_events
        assert entry["guarantee"]["kind"] == "differential-privacy"
        assert 0 < entry["guarantee"]["epsilon"] < EPSILON

    # Recomposed independently with dp_accounting, the worst client's releases match the summary.
    worst = privacy["worst_case_client"]
    worst_events = [event for entry in ledger if entry["client"] == worst for event in entry["events"]]
    recomposed = _independent_epsilon(worst_events, delta)
    assert recomposed <= EPSILON
    assert privacy["epsilon"] == pytest.approx(recomposed, abs=0.02)
    assert max(
        _independent_epsilon([ev for e in ledger if e["client"] == c for ev in e["events"]], delta)
        for c in range(NUM_CLIENTS)
    ) == pytest.approx(recomposed)


def test_run_certain_to_exceed_the_plugins_budget_is_refused(plugin_env, tmp_path):
    out = tmp_path / "refused"
    result = run_privfed(
        plugin_env, *TRAIN_ARGS, "--epsilon", str(EPSILON), "--epsilon-per-release", "2.9", "--out", str(out),
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "--rounds 0" in lines[0], result.stderr
    assert not out.exists()  # refused before anything started


AGGREGATED = "cellmean"


@pytest.fixture(scope="module")
def aggregated_plugin_env(tmp_path_factory) -> dict[str, str]:
    """An environment in which the aggregated ``cellmean`` is installed, as far as ``importlib.metadata`` can tell."""
    entry = f"{AGGREGATED} = cell_mean_mechanism:CellMeanMechanism"
    return installed_env(tmp_path_factory.mktemp("site-aggregated"), "fake-privfed-aggregated-plugin", entry)


def test_a_third_party_aggregated_mechanism_runs_inside_secagg_like_a_built_in_one(aggregated_plugin_env, tmp_path):
    out = tmp_path / "run"
    args = [a for a in TRAIN_ARGS if a != "--no-secagg"]
    args[args.index(NAME)] = AGGREGATED
    result = run_privfed(aggregated_plugin_env, *args, "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["secure_aggregation"]["enabled"] and summary["secure_aggregation"]["halted_rounds"] == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # Round 0 has no secure sum; every later round's sum moves centroids, and holds every client's share.
    assert "moved_centroid_fraction" not in metrics[0]
    assert all(m["moved_centroid_fraction"] > 0 and m["clients"] == NUM_CLIENTS for m in metrics[1:])
    config = json.loads((out / "config.json").read_text())
    assert config["mechanism"] == AGGREGATED
