"""The cross-round attack: unmixing a client's releases over rounds, on synthetic drifting memories and a real run.

The synthetic client holds 64 images whose unit representations (D = 32) sit
around 6 directions; each round it recomputes them with a small drift and
fresh augmentation noise and releases them through the real mechanism.
"""

from __future__ import annotations

import json
import statistics

import pytest
import torch
import torch.nn.functional as F

from attacks.attackers.cross_round import CrossRoundUnmixing, representation_map, slot_vectors, unmix
from attacks.base import AttackTarget, ReleaseHistory
from attacks.registry import get_attack_class
from attacks.scoring.vector_recovery import matched_cosine
from mechanisms import create_mechanism

ROWS, DIM, DIRECTIONS, CENTROIDS = 64, 32, 6, 4
SEEDS = range(3)


def drifting_memories(
    seed: int, rounds: int, *, images: int = 0, drift: float = 0.02, noise: float = 0.3
) -> list[torch.Tensor]:
    """One client's memory in each round: the same images, moved by ``drift`` per round, seen with fresh noise.
    ``seed`` fixes the population (its directions), ``images`` which images of it the client holds."""
    directions = F.normalize(torch.randn(DIRECTIONS, DIM, generator=torch.Generator().manual_seed(seed)), dim=1)
    g = torch.Generator().manual_seed(1000 * seed + images + 1)
    latent = F.normalize(directions[torch.arange(ROWS) % DIRECTIONS] + 0.4 * torch.randn(ROWS, DIM, generator=g), dim=1)
    memories = []
    for _ in range(rounds):
        latent = F.normalize(latent + drift * torch.randn(ROWS, DIM, generator=g), dim=1)
        memories.append(F.normalize(latent + noise * torch.randn(ROWS, DIM, generator=g) / DIM**0.5, dim=1))
    return memories


def released(memories: list[torch.Tensor], mechanism: str, seed: int, **params) -> ReleaseHistory:
    vectors, weights = [], []
    for r, memory in enumerate(memories):
        release = create_mechanism(mechanism, **params).release(
            memory, num_centroids=CENTROIDS, generator=torch.Generator().manual_seed(100 * seed + r)
        )
        vectors.append(release.vectors.float())
        weights.append(release.weights.float())
    return ReleaseHistory(0, tuple(range(len(memories))), tuple(vectors), tuple(weights))


def estimate(history: ReleaseHistory, seed: int) -> torch.Tensor:
    return unmix(history, decay=1.0, generator=torch.Generator().manual_seed(seed)).vectors  # no targets: no alignment


def test_one_round_gives_back_the_released_vectors_each_as_often_as_its_weight():
    history = released(drifting_memories(0, 1), "kanon", 0)
    out = unmix(history, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out.source, slot_vectors(history.weights[0]))
    assert torch.allclose(out.vectors, history.vectors[0][out.source], atol=1e-5)


def test_kanon_releases_over_many_rounds_give_single_representations_one_round_does_not():
    """The differencing argument, at scale: more rounds of the same images under drift pin each image better."""
    single, across = [], []
    for seed in SEEDS:
        memories = drifting_memories(seed, 12)
        history = released(memories, "kanon", seed)
        truth = memories[-1]
        single.append(matched_cosine(history.vectors[-1][slot_vectors(history.weights[-1])], truth))
        across.append(matched_cosine(estimate(history, seed), truth))
    gains = [a - s for a, s in zip(across, single)]
    assert min(gains) > 0.05, (single, across)


def null_gaps(seeds, **params) -> list[float]:
    """Per seed: matched cosine to the client's last memory of the estimates from its ``ldp-sums`` history, less
    that of the estimates from a history of other images of the same population (the null)."""
    gaps = []
    for seed in seeds:
        memories, others = drifting_memories(seed, 8), drifting_memories(seed, 8, images=1)
        a = estimate(released(memories, "ldp-sums", seed, **params), seed)
        b = estimate(released(others, "ldp-sums", seed, **params), seed)
        if a.shape[0] and b.shape[0]:
            gaps.append(matched_cosine(a, memories[-1]) - matched_cosine(b, memories[-1]))
    return gaps


def test_an_ldp_sums_history_says_little_more_of_the_client_than_one_of_other_images():
    """At ε = 4 per release (8 releases: ε 14 for the whole history at δ 1e-5, a bound that allows nearly
    anything) the cross-round estimates match the client's memory within 0.05 of the null. Not at it: over 8
    runs the mean gap was 0.010 (sd 0.008; each released cell mean is of the client's own rows), against about
    0.09 at negligible noise (next test) and 0.14 for kanon. DP hides an image, not the population: a null of
    another population would be matched worse, and that gap is no leak of an image."""
    gaps = null_gaps(SEEDS, epsilon=4.0)
    assert gaps and statistics.fmean(gaps) < 0.05, gaps


def test_the_null_comparison_sees_an_ldp_sums_history_at_negligible_noise():
    """The 0.05 line above has power: with almost no noise the same comparison is well above it."""
    (gap,) = null_gaps([0], noise_multiplier=1e-3)
    assert gap > 0.05, gap


def test_settings_are_checked_and_the_inverter_is_a_single_round_attack():
    assert get_attack_class("cross-round") is CrossRoundUnmixing
    attack = CrossRoundUnmixing(window=3, decay=0.2, steps=7)
    assert attack.settings()["inverter"] == {"method": "decoder", "seed": 0, "steps": 7, "batch_size": 64, "lr": 2e-3, "views": 8}
    for bad in ({"window": 0}, {"decay": 1.5}, {"decay": -0.1}, {"inverter": "cross-round"}, {"unmix_lr": 0}):
        with pytest.raises(ValueError):
            CrossRoundUnmixing(**bad)


@pytest.fixture(scope="module")
def kanon_run(tmp_path_factory):
    from tests.attacks.test_attack_run import tiny_run

    return tiny_run(
        tmp_path_factory.mktemp("cross") / "kanon", mechanism="kanon", kanon_min_k=4, rounds=2
    )


def test_privfed_attack_runs_it_on_a_recorded_run_and_scores_the_estimates_against_the_memory(kanon_run, run_privfed):
    result = run_privfed(
        "attack", str(kanon_run.path), "--method", "cross-round", "--steps", "5", "--max-vectors", "12", "--rounds", "2"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((kanon_run.path / "attack.json").read_text())
    (row,) = report["rounds"]
    assert row["vectors"] == 12 and report["attack"]["method"] == "cross-round"
    assert report["attack"]["inverter"]["steps"] == 5
    for name in ("psnr_best_member", "reid_rate", "matched_cosine", "single_round_matched_cosine", "null_matched_cosine"):
        assert name in row
    assert row["n_matched_cosine"] >= 1 and -1 <= row["matched_cosine"] <= 1
    # The single-round attack with the same fit, on the round's own release, for a paired comparison.
    single = row["single_round"]
    assert single["vectors"] == 12 and {"psnr_best_member", "null_psnr_best_member", "reid_rate"} <= set(single)
    assert "matched_cosine " in result.stdout and "one round" in result.stdout
    # Split by whether a client's images all fit in its memory (then its memory is the same images every round).
    groups = row["by_client_size"]
    assert groups and set(groups) <= {"fewer_images_than_memory", "at_least_memory_images"}
    assert sum(g["vectors"] for g in groups.values()) == row["vectors"]
    per_client = row["matched_cosine_per_client"]
    assert len(per_client) == row["n_matched_cosine"] and all(c["images"] > 0 for c in per_client)


class Rotated(torch.nn.Module):
    """A tiny image encoder, its output turned by a fixed rotation: a model that moved between two rounds."""

    def __init__(self, base: torch.nn.Module, rotation: torch.Tensor) -> None:
        super().__init__()
        self.base, self.rotation = base, rotation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) @ self.rotation


def two_rounds_of_one_model_turned() -> tuple[AttackTarget, AttackTarget, torch.Tensor]:
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(32, 8))
    rotation = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(1)))[0]
    common = dict(mechanism="kanon", mechanism_params={}, centroids=None, num_local_centroids=2, memory_size=16, batch_size=16)
    return AttackTarget(round=1, encoder=base, **common), AttackTarget(round=2, encoder=Rotated(base, rotation), **common), rotation


def test_the_map_between_two_rounds_models_is_recovered_from_auxiliary_views():
    before, after, rotation = two_rounds_of_one_model_turned()
    aux = torch.randint(0, 256, (128, 3, 16, 16), dtype=torch.uint8)
    found = representation_map(before, after, aux, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(found, rotation, atol=1e-3)


def test_estimates_read_older_rounds_in_the_attacked_rounds_space():
    """Aligned, a history whose older round was released under the turned-back model gives the estimates of the
    same history turned by hand; unaligned, it does not."""
    before, after, rotation = two_rounds_of_one_model_turned()
    memories = [m[:, :8] for m in drifting_memories(0, 2)]
    memories = [F.normalize(m, dim=1) for m in memories]
    by_hand = released([memories[0] @ rotation, memories[1] @ rotation], "kanon", 0)
    received = ReleaseHistory(
        0, (1, 2), (by_hand.vectors[0] @ rotation.T, by_hand.vectors[1]), by_hand.weights, (before, after)
    )
    expected = ReleaseHistory(0, (1, 2), by_hand.vectors, by_hand.weights)
    aux = torch.randint(0, 256, (128, 3, 16, 16), dtype=torch.uint8)
    aligned = CrossRoundUnmixing(decay=1.0).estimate(received, aux)
    want = CrossRoundUnmixing(decay=1.0).estimate(expected, aux)
    assert torch.allclose(aligned.vectors, want.vectors, atol=1e-2)
    unaligned = CrossRoundUnmixing(decay=1.0, align=False).estimate(received, aux)
    assert not torch.allclose(unaligned.vectors, want.vectors, atol=1e-2)


def test_a_client_with_more_images_than_its_memory_remembers_other_images_each_round(kanon_run):
    """docs/attacks.md ("Across rounds"): the memory is the last batches of a fresh shuffle, so two rounds share
    about memory_size / n of its images (here 32 of 80 to 124 images: 7 to 14 of 32 rows), not most of them."""
    from attacks.scoring.ground_truth import replay_round
    from privfed.run.recording import read_round

    config = kanon_run.config()
    for client in range(config.num_clients):
        rounds = [replay_round(config, read_round(kanon_run.releases, r), client)[0] for r in (1, 2)]
        first, second = (set(memory.memory_examples.tolist()) for memory in rounds)
        assert rounds[0].images.shape[0] > 2 * config.memory_size
        assert len(first) == len(second) == config.memory_size and len(first & second) < config.memory_size / 2


def test_a_study_attacks_the_last_round_across_rounds(kanon_run):
    from attacks.evaluation import attack_last_round
    from privfed.studies.cell_work import attack_figures

    figures = attack_last_round(
        kanon_run.path, method="cross-round",
        attack_settings={"steps": 5, "iterations": 2, "unmix_steps": 5, "align_images": 64, "max_rows": 8},
    )
    assert figures["round"] == 2 and 0 < figures["vectors"] <= 3 * 8
    assert attack_figures(figures)["attack_advantage_psnr"] == figures["advantage_psnr_best_member"]
