"""`privfed attack` on a real recorded run: the figures it writes, the truth it replays, and its errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from attacks.scoring.ground_truth import NOT_REPLAYABLE, REPLAY_DIFFERS, VERIFIED, recorded_truth
from privfed.config import build_config
from privfed.data import FederatedSplit, load_dataset
from privfed.run.directory import RunDirectory
from privfed.run.recording import RecordedRelease, read_round, write_round


def tiny_run(out, **overrides):
    from privfed.federation.simulation import simulate
    from privfed.run.plan import plan_run

    settings = dict(
        dataset="shapes:300", num_clients=3, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=1, secagg=False,
        record_releases=True, out=str(out),
    )
    config = build_config(**{**settings, **overrides})
    simulate(plan_run(config))
    return RunDirectory(out)


@pytest.fixture(scope="module")
def kanon_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("attack") / "kanon", mechanism="kanon", kanon_min_k=4)


def test_the_replayed_truth_matches_the_recorded_release(kanon_run):
    config = kanon_run.config()
    recorded = read_round(kanon_run.releases, 1)
    release = recorded.releases[0]
    memory, truths, status = recorded_truth(config, recorded, release)
    assert status == VERIFIED
    assert memory.images.shape[0] == FederatedSplit.of(config).client_sizes()[release.client]  # its whole dataset
    for j, truth in enumerate(truths):  # each centroid is the mean of its members' replayed representations
        rows = torch.isin(memory.memory_examples, truth.members)
        assert truth.members.numel() == int(release.weights[j]) >= 4
        assert torch.allclose(torch.nn.functional.normalize(memory.memory[rows].mean(0), dim=0), release.vectors[j], atol=1e-4)
    tampered = RecordedRelease(release.client, release.vectors.roll(1, dims=0), release.weights, release.guarantee)
    assert recorded_truth(config, recorded, tampered)[2] == REPLAY_DIFFERS


def test_attack_writes_every_figure_next_to_its_null_and_the_run_statement(kanon_run, run_privfed):
    result = run_privfed("attack", str(kanon_run.path), "--method", "decoder", "--steps", "20", "--max-vectors", "6", "--rounds", "1")
    assert result.returncode == 0, result.stderr
    assert "decoder: 20/20" in result.stdout  # the progress display
    report = json.loads((kanon_run.path / "attack.json").read_text())
    (row,) = report["rounds"]
    assert row["round"] == 1 and row["vectors"] == 6 and set(row["membership"].values()) == {VERIFIED}
    for score in ("psnr_best_member", "psnr_mean_member", "ssim_best_member", "psnr_best_client", "reid_rate"):
        assert {score, f"null_{score}", f"advantage_{score}", f"advantage_{score}_ci95", f"n_{score}"} <= set(row)
    assert 0 < row["reid_chance"] < 1 and "psnr_source" not in row  # centroids: no single source
    assert report["privacy_statement"] and report["attack"]["steps"] == 20 and report["null"]
    assert report["auxiliary"]["no_exact_duplicates_of_client_images"] is True
    assert (kanon_run.path / "attack.png").stat().st_size > 0


def test_attack_says_what_it_attacks_before_loading_and_before_each_fit(kanon_run):
    """A CIFAR attack spent 90 s loading and fitting before its first line; now each stage is named as it starts."""
    from privfed.api import attack

    lines: list[str] = []
    attack(kanon_run.path, method="decoder", rounds=[1], steps=2, max_vectors=2, device="cpu", log=lines.append,
           progress=lambda *_: lines.append("step"))
    assert lines[0] == f"attacking {kanon_run.path} with decoder, round(s) 1: loading the auxiliary data"
    assert lines[1].startswith("round 1: fitting decoder on ") and lines[2] == "step"


def test_bad_input_is_one_line_never_a_traceback(kanon_run, run_privfed, tmp_path):
    def error(*args):
        result = run_privfed("attack", *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        return result.stderr.strip()

    run = str(kanon_run.path)
    assert "unknown attack 'inversion'" in error(run, "--method", "inversion")
    assert "rounds [5] were not recorded" in error(run, "--method", "decoder", "--rounds", "5")
    unrecorded = tmp_path / "unrecorded"
    shutil.copytree(kanon_run.path, unrecorded, ignore=shutil.ignore_patterns("releases"))
    assert "train with --record-releases" in error(str(unrecorded), "--method", "decoder")
    # Auxiliary data whose test split holds the clients' own images.
    train = load_dataset("shapes:300", split="train", data_dir=tmp_path)
    np.savez(tmp_path / "leak.npz", x=train.images[:10], y=train.labels[:10], x_test=train.images[:50], y_test=train.labels[:50])
    assert "shares" in error(run, "--method", "decoder", "--aux", f"arrays:{tmp_path / 'leak.npz'}")
    # A round in which nothing was released.
    empty = tmp_path / "empty"
    shutil.copytree(kanon_run.path, empty)
    recorded = read_round(RunDirectory(empty).releases, 1)
    hollow = [RecordedRelease(r.client, r.vectors[:0], r.weights[:0], r.guarantee) for r in recorded.releases]
    write_round(RunDirectory(empty).releases, recorded.__class__(**{**recorded.__dict__, "releases": tuple(hollow)}))
    assert "round 1 holds no released vectors" in error(str(empty), "--method", "decoder", "--rounds", "1")


def test_a_dp_release_cannot_be_replayed_so_its_members_stay_unknown(tmp_path):
    run = tiny_run(tmp_path / "ldp", mechanism="ldp", epsilon=50.0)
    recorded = read_round(run.releases, 1)
    memory, truths, status = recorded_truth(run.config(), recorded, recorded.releases[0])
    assert status == NOT_REPLAYABLE and all(t.members is None for t in truths) and memory.memory is None


def test_the_attack_is_fitted_and_inverts_every_vector_before_any_client_is_replayed(kanon_run, monkeypatch):
    import attacks.evaluation as evaluation
    from attacks import registry
    from attacks.base import Attack

    events: list[str] = []

    class OrderSpy(Attack):
        name, description = "order-spy", "records when it is fitted and asked to invert"

        def fit(self, target, aux_images, *, progress=None):
            events.append("fit")

            def invert(vectors):
                events.append("invert")
                return torch.full((vectors.shape[0], 3, 32, 32), 0.5)

            return invert

    def replay(*args, **kwargs):
        events.append("replay")
        return recorded_truth(*args, **kwargs)

    monkeypatch.setitem(registry._REGISTRY, OrderSpy.name, OrderSpy)
    monkeypatch.setattr(evaluation, "recorded_truth", replay)
    evaluation.attack_run(kanon_run.path, method=OrderSpy.name, rounds=[0, 1], max_vectors=4, device="cpu")
    per_round = "".join(e[0] for e in events).split("f")[1:]  # f(it) i(nvert) r(eplay), one block per round
    assert len(per_round) == 2
    for block in per_round:
        assert block.startswith("ii") and "r" in block and "i" not in block[block.index("r"):], events


def test_a_study_attacks_only_the_last_round(kanon_run):
    from attacks.evaluation import attack_last_round

    figures = attack_last_round(kanon_run.path, method="decoder", attack_settings={"steps": 5})
    assert figures["round"] == 1 and figures["vectors"] > 0 and "advantage_psnr_best_member" in figures
    assert [r["round"] for r in json.loads((kanon_run.path / "attack.json").read_text())["rounds"]] == [1]


def test_a_last_round_of_padding_only_scores_no_vectors_instead_of_failing(tmp_path):
    """A DP mechanism at a small epsilon can release only padding: the study keeps the run and says nothing was attackable."""
    from attacks.evaluation import attack_last_round

    # A noisy count crosses its 3-std threshold by chance now and then (OS noise, ~0.1 % per tree node), so a
    # run whose last round released a real vector is drawn again: three in a row would be a real change.
    for attempt in range(3):
        run = tiny_run(tmp_path / f"ldp-{attempt}", mechanism="ldp", epsilon=0.05)
        recorded = read_round(run.releases, 1)
        if all(float(r.weights.sum()) == 0 for r in recorded.releases):
            break
    assert all(float(r.weights.sum()) == 0 for r in recorded.releases)  # every release is padding
    figures = attack_last_round(run.path, method="decoder", attack_settings={"steps": 5})
    assert figures == {"round": 1, "vectors": 0, "vectors_released": sum(r.vectors.shape[0] for r in recorded.releases),
                       "vectors_with_weight": 0}
    assert not (run.path / "attack.json").exists()
