"""A whole `privfed train` run under Flower's simulation runtime, then `privfed evaluate` on it.

One small real run (module-scoped) backs every test here: the run directory's
contract, the round log, and re-evaluation of its checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 2


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, run_privfed) -> Path:
    out = tmp_path_factory.mktemp("run") / "quick"
    result = run_privfed(
        "train", "--config", str(REPO / "configs" / "quick.toml"), "--rounds", str(ROUNDS),
        "--out", str(out), "--device", "cpu",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_run_directory_has_its_files(run_dir):
    for name in ("config.json", "metrics.jsonl", "summary.json", "curves.png", "checkpoints/initial.pt", "checkpoints/final.pt",
                 "checkpoints/resume.pt"):
        assert (run_dir / name).is_file(), name


def test_summary_reports_accuracy_rounds_time_and_guarantee(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0 <= summary["knn_accuracy"] <= 1 and 0 <= summary["knn_accuracy_init"] <= 1
    assert summary["rounds"] == ROUNDS
    assert summary["wall_seconds"] > 0
    assert summary["mechanism"]["name"] == "kanon"
    privacy = summary["privacy"]
    assert privacy["mechanism"] == "kanon" and privacy["epsilon"] is None and privacy["delta"] is None
    assert privacy["k"] == 64 // 4  # quick.toml: memory 64, L = 4
    assert "at least 16" in privacy["statement"]
    # The headline quotes the run's k; the long text is in the file once, and docs/privacy.md has the rest.
    assert "mean of at least 16 distinct images" in privacy["headline"] and len(privacy["headline"]) <= 300
    assert privacy["covers"] == [] and privacy["details"] == "docs/privacy.md#statement-k-anonymity"
    assert "guarantee" not in summary["mechanism"]
    assert (run_dir / "summary.json").read_text().count("what stands in the way today is a server that follows the plan") == 1
    assert summary["stopped_early"] is None


def test_config_json_is_the_resolved_configuration(run_dir):
    config = json.loads((run_dir / "config.json").read_text())
    assert config["rounds"] == ROUNDS  # the flag overrode the preset
    assert config["dataset"] == "shapes:1000"  # the preset overrode the default
    assert config["out"] == str(run_dir)


def test_metrics_has_one_record_per_round_starting_with_initialisation(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == list(range(ROUNDS + 1))
    assert records[0]["task"] == "init" and records[0]["loss"] is None
    for record in records[1:]:
        assert record["task"] == "train"
        assert record["clients_completed"] == record["clients_sampled"] == 4
        assert record["loss"] is None and record["train_seconds"] is None  # clients send no metrics by default
    assert "knn_accuracy" in records[-1]


def test_evaluate_initial_checkpoint_reproduces_the_training_runs_init_accuracy(run_dir, run_privfed):
    summary = json.loads((run_dir / "summary.json").read_text())
    result = run_privfed(
        "evaluate", str(run_dir), "--train-data", "shapes:1000", "--test-data", "shapes:1000",
        "--protocol", "knn", "--checkpoint", "initial", "--device", "cpu",
    )
    assert result.returncode == 0, result.stderr
    evaluations = json.loads((run_dir / "evaluation.json").read_text())["evaluations"]
    assert evaluations[-1]["accuracy"] == pytest.approx(summary["knn_accuracy_init"], abs=1e-6)


def test_evaluate_linear_probe_appends_a_result(run_dir, run_privfed):
    before = run_dir / "evaluation.json"
    count = len(json.loads(before.read_text())["evaluations"]) if before.is_file() else 0
    result = run_privfed(
        "evaluate", str(run_dir), "--train-data", "shapes:1000", "--test-data", "shapes:1000",
        "--protocol", "linear", "--device", "cpu",
    )
    assert result.returncode == 0, result.stderr
    assert "linear accuracy" in result.stdout
    evaluations = json.loads(before.read_text())["evaluations"]
    assert len(evaluations) == count + 1
    assert evaluations[-1]["protocol"] == "linear" and 0 <= evaluations[-1]["accuracy"] <= 1


def test_evaluate_fine_tunes_on_a_class_balanced_fraction_of_the_labels(run_dir, run_privfed):
    from privfed.data import load_dataset
    from privfed.evaluation.label_subsets import class_balanced_subset

    result = run_privfed(
        "evaluate", str(run_dir), "--train-data", "shapes:1000", "--test-data", "shapes:1000",
        "--protocol", "finetune", "--label-fraction", "0.05", "--seed", "2", "--device", "cpu",
    )
    assert result.returncode == 0, result.stderr
    last = json.loads((run_dir / "evaluation.json").read_text())["evaluations"][-1]
    train = load_dataset("shapes:1000", split="train", data_dir=run_dir)
    assert last["protocol"] == "finetune" and 0 <= last["accuracy"] <= 1
    assert last["num_labelled"] == len(class_balanced_subset(train.labels, 0.05, seed=2)) < len(train) // 10
    assert last["label_fraction"] == 0.05 and last["seed"] == 2 and last["schedule"]["epochs"] > 0


def test_evaluate_rejects_a_missing_checkpoint(run_dir, run_privfed):
    result = run_privfed(
        "evaluate", str(run_dir), "--train-data", "shapes:1000", "--test-data", "shapes:1000",
        "--checkpoint", str(run_dir / "nope.pt"),
    )
    assert result.returncode != 0
    assert "checkpoint not found" in result.stderr and "Traceback" not in result.stderr


def test_evaluate_scores_every_image_of_a_test_file_named_only_for_testing(run_dir, run_privfed, tmp_path):
    from privfed.data import load_dataset

    held_out = load_dataset("shapes:1000", split="test", data_dir=tmp_path)
    path = tmp_path / "test-only.npz"
    np.savez(path, x=held_out.images[:37], y=held_out.labels[:37])
    result = run_privfed(
        "evaluate", str(run_dir), "--train-data", "shapes:1000", "--test-data", f"arrays:{path}",
        "--protocol", "knn", "--device", "cpu",
    )
    assert result.returncode == 0, result.stderr
    last = json.loads((run_dir / "evaluation.json").read_text())["evaluations"][-1]
    assert last["num_test"] == 37 and last["test_split"] == "all" and last["train_split"] == "train"


def test_evaluate_draws_the_test_representations_by_class(run_dir, run_privfed):
    result = run_privfed("evaluate", str(run_dir), "--test-data", "shapes:1000", "--protocol", "tsne", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    last = json.loads((run_dir / "evaluation.json").read_text())["evaluations"][-1]
    assert last["protocol"] == "tsne" and last["accuracy"] is None and last["num_test"] > 0
    assert Path(last["picture"]) == run_dir / "embedding-tsne-final.png" and Path(last["picture"]).stat().st_size > 10_000
    own = run_privfed("evaluate", str(run_dir), "--protocol", "knn", "--device", "cpu")  # the run's own data
    assert own.returncode == 0, own.stderr
    last = json.loads((run_dir / "evaluation.json").read_text())["evaluations"][-1]
    recorded = json.loads((run_dir / "config.json").read_text())
    assert last["train_data"] == recorded["dataset"] and last["protocol"] == "knn"
