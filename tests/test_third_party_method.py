"""A third-party method, installed only through the ``privfed.methods`` entry point, trains end to end.

The plug-in (``examples/third_party_method.py``) is never imported by
privfed's code: a fake installed distribution in ``tmp_path`` declares it,
and the real ``privfed`` CLI runs in a subprocess that sees it installed.
"""

from __future__ import annotations

import json
import math

import torch

from tests.plugin_env import installed_env, run_privfed

NAME = "tinysiam"
TRAIN_ARGS = (
    "train", "--dataset", "shapes:300", "--num-clients", "4", "--participation", "1.0", "--projection-dim", "16",
    "--local-epochs", "1", "--batch-size", "16", "--rounds", "2", "--method", NAME, "--no-secagg", "--device", "cpu",
    "--report-client-metrics",
)


def test_a_third_party_method_trains_its_declared_head_through_the_real_cli(tmp_path):
    env = installed_env(tmp_path / "site", "fake-privfed-method", f"{NAME} = third_party_method:TINYSIAM", group="privfed.methods")
    out = tmp_path / "run"
    result = run_privfed(env, *TRAIN_ARGS, "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"]["name"] == NAME and not summary["method"]["releases"] and summary["rounds"] == 2
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics if m["task"] == "train"]
    assert len(losses) == 2 and all(-1 <= loss <= 1 for loss in losses)  # its negative cosine, averaged over clients
    assert all(m["cluster_loss"] is None for m in metrics)  # nothing of Orchestra's ran

    initial = torch.load(out / "checkpoints" / "initial.pt")["network"]
    final = torch.load(out / "checkpoints" / "final.pt")["network"]
    assert {k.split(".")[0] for k in final} == {"online", "tiny_predictor"}  # the declared head, and only it
    assert not torch.equal(initial["tiny_predictor.weight"], final["tiny_predictor.weight"])  # and it was trained
    assert math.isfinite(summary["knn_accuracy"])


def test_the_method_is_a_choice_only_when_its_distribution_is_installed(tmp_path):
    env = installed_env(tmp_path / "site", "fake-privfed-method", f"{NAME} = third_party_method:TINYSIAM", group="privfed.methods")
    assert NAME in run_privfed(env, "train", "--help", cwd=tmp_path).stdout
    bare = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    refused = run_privfed(bare, *TRAIN_ARGS, "--out", str(tmp_path / "no"), cwd=tmp_path)
    assert refused.returncode != 0 and "unknown method 'tinysiam'" in refused.stderr
