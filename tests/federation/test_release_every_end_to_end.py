"""``privfed train --release-every K``: clients release, and are charged, only in rounds 0, 1, 1 + K, ...

Each run is real (the CLI in a subprocess, tiny data). The server's ledger and every client's own ledger must
hold exactly the rounds that released; the centroids must stay through a round without a release; a run killed
with SIGKILL in such a round must resume to exactly the run left alone (kanon: no noise, so runs repeat).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from privfed.data.federated import FederatedSplit
from privfed.privacy.budget import plan_privacy
from privfed.run.directory import RunDirectory
from privfed.run.recording import read_round
from tests.run_records import jsonl, same

TINY = (
    "--dataset", "shapes:300", "--num-clients", "4", "--participation", "1.0", "--projection-dim", "16",
    "--local-epochs", "1", "--batch-size", "16", "--memory-size", "32", "--num-local-centroids", "4",
    "--num-global-centroids", "8", "--device", "cpu", "--seed", "1",
)


def release_rounds(path: Path, client: int | None = None) -> list[int]:
    return sorted(
        {e["round"] for e in jsonl(path) if e["kind"] == "release" and (client is None or e["client"] == client)}
    )


@pytest.mark.parametrize(
    ("mechanism", "released"), [("ldp-sums", [0, 1, 3, 5]), ("ddp-sums", [1, 3, 5])]
)
def test_a_cadence_is_charged_exactly_the_releases_it_made_on_the_server_and_every_client(
    tmp_path, run_privfed, mechanism, released
):
    out = tmp_path / "run"
    result = run_privfed(
        "train", *TINY, "--rounds", "5", "--release-every", "2", "--mechanism", mechanism, "--epsilon", "10",
        "--record-releases", "--out", str(out),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    config = RunDirectory(out).config()
    plan = plan_privacy(config, FederatedSplit.of(config).client_sizes())
    assert plan.max_releases == len(released)  # calibrated for the releases that happen, not for 5 or 6
    assert release_rounds(out / "ledger.jsonl") == released
    planned = [{"name": e.name, "params": e.params} for e in plan.per_release_events]
    for client in range(4):
        own = out / "client-ledgers" / f"privfed-ledger-partition-{client}.jsonl"
        assert release_rounds(own) == released
        assert all(e["events"] == planned for e in jsonl(own) if e["kind"] == "release")
    privacy = json.loads((out / "summary.json").read_text())["privacy"]
    assert 9.9 <= privacy["epsilon"] <= 10.0 * (1 + 1e-9)  # the whole budget, over fewer releases
    metrics = jsonl(out / "metrics.jsonl")
    assert [m["clients_completed"] for m in metrics] == [4] * 6
    for skipped in (2, 4):
        assert "moved_centroid_fraction" not in metrics[skipped]
        assert not read_round(out / "releases", skipped).releases
        sent = [read_round(out / "releases", r).centroids for r in (skipped, skipped + 1)]
        assert torch.equal(sent[0], sent[1])  # the round without a release left the centroids where they were
    assert all(metrics[r]["moved_centroid_fraction"] > 0 for r in (1, 3))


def test_release_every_needs_a_method_that_releases(tmp_path, run_privfed):
    result = run_privfed("train", *TINY, "--rounds", "2", "--release-every", "2", "--method", "rotpred",
                         "--out", str(tmp_path / "run"))
    assert result.returncode != 0 and "--release-every" in result.stdout + result.stderr


KANON = [*TINY, "--rounds", "4", "--release-every", "3", "--mechanism", "kanon", "--kanon-min-k", "2"]


def _train(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "privfed.cli", "train", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _logged(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    return [m["round"] for m in jsonl(path)] if path.is_file() else []


@pytest.mark.slow
def test_a_run_killed_in_a_round_without_a_release_resumes_to_the_run_left_alone(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    alone = _train([*KANON, "--out", str(whole)])
    process = _train([*KANON, "--out", str(killed)])
    deadline = time.monotonic() + 300
    while 2 not in _logged(killed):  # round 2 is logged: the kill lands in round 3, which releases nothing
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-2000:]
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert 3 not in _logged(killed)
    resumed = subprocess.run([sys.executable, "-m", "privfed.cli", "train", "--resume", str(killed)],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert alone.wait(timeout=600) == 0, alone.stderr.read()[-3000:]

    def comparable(record: dict) -> dict:
        return {k: v for k, v in record.items() if not k.endswith("seconds")}

    a, b = jsonl(whole / "metrics.jsonl"), jsonl(killed / "metrics.jsonl")
    assert [m["round"] for m in b] == [0, 1, 2, 3, 4]
    assert all(same(comparable(x), comparable(y)) for x, y in zip(a, b))
    final_a = torch.load(whole / "checkpoints" / "final.pt", weights_only=True)
    final_b = torch.load(killed / "checkpoints" / "final.pt", weights_only=True)
    assert all(torch.equal(v, final_b["network"][k]) for k, v in final_a["network"].items())
    assert torch.equal(final_a["centroids"], final_b["centroids"])
    assert jsonl(whole / "ledger.jsonl") == jsonl(killed / "ledger.jsonl")
    assert release_rounds(killed / "ledger.jsonl") == [0, 1, 4]
    for client in range(4):
        name = f"privfed-ledger-partition-{client}.jsonl"
        assert jsonl(whole / "client-ledgers" / name) == jsonl(killed / "client-ledgers" / name)
        assert release_rounds(killed / "client-ledgers" / name) == [0, 1, 4]
