"""``benchmarks/same_seed_metrics.py``: its seeding makes the package's CSPRNG draws repeat, and its fingerprint drops timings."""

from __future__ import annotations

import json
import random
import secrets
from pathlib import Path

import pytest

from tests.benchmarks.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "same_seed_metrics.py"


@pytest.fixture(scope="module")
def bench():
    return load_script("same_seed_metrics", SCRIPT)


@pytest.fixture
def restored(monkeypatch):
    """The seeding's replacements undone after the test."""
    for module, name in ((secrets, "SystemRandom"), (random, "SystemRandom"), (secrets, "randbits"),
                         (secrets, "randbelow"), (secrets, "choice")):
        monkeypatch.setattr(module, name, getattr(module, name))
    from mechanisms import noise

    monkeypatch.setattr(noise, "secure_source", noise.secure_source)
    return noise


def test_seeded_noise_and_secret_seeds_repeat_and_differ_by_seed(bench, restored):
    def draws(seed: str):
        bench.seed_os_randomness(seed)
        bench.patch_secure_source()
        noise = restored.discrete_gaussian(16, sigma=3.0)  # the mechanisms' default source
        return noise.tolist(), restored.secure_source().random(), secrets.randbits(63)  # DP-SGD's seeds

    first = draws("a")
    assert draws("a") == first
    assert draws("b") != first


def test_the_fingerprint_keeps_figures_and_drops_timings(bench, tmp_path):
    line = {"round": 2, "knn_accuracy": 0.5, "round_seconds": 1.0, "elapsed_seconds": 9.0, "task": "train",
            "sampled_clients": [0, 1], "rejection_reasons": [], "loss": None, "nested": {"x": 1, "wall_seconds": 2}}
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"round": 0}) + "\n" + json.dumps(line) + "\n")
    privacy = {"headline": "No DP", "epsilon": 4.9, "statement": "long", "covers": ["text"], "dp_sgd": {"epsilon": 2.0}}
    (tmp_path / "summary.json").write_text(json.dumps({"knn_accuracy": 0.5, "wall_seconds": 3.0, "privacy": privacy}))
    (tmp_path / "ledger.jsonl").write_text("{}\n{}\n")
    printed = bench.fingerprint(tmp_path)
    assert printed["metrics"] == {"round": 2, "knn_accuracy": 0.5, "sampled_clients": [0, 1], "loss": None, "nested.x": 1}
    assert printed["privacy"] == {"epsilon": 4.9, "dp_sgd.epsilon": 2.0}
    assert printed["privacy_headline"] == "No DP"
    assert (printed["metrics_lines"], printed["ledger_entries"], printed["client_ledger_entries"]) == (2, 2, None)
    assert printed["encoder_sha256"].startswith("unavailable")  # no checkpoint here


def test_a_dp_sgd_line_is_compared_without_its_training_results(bench):
    line = {"run": "dp-sgd-rotpred", "exit_code": 0, "encoder_sha256": "x", "privacy": {"epsilon": 8.0},
            "metrics": {"knn_accuracy": 0.2, "round": 2, "privacy_epsilon": 8.0}, "summary": {"knn_accuracy": 0.2, "rounds": 2}}
    kept = bench.comparable(line)
    assert "encoder_sha256" not in kept and kept["privacy"] == {"epsilon": 8.0}
    assert kept["metrics"] == {"round": 2, "privacy_epsilon": 8.0} and kept["summary"] == {"rounds": 2}
    assert bench.comparable({**line, "run": "mechanism-ldp"}) == {**line, "run": "mechanism-ldp"}
