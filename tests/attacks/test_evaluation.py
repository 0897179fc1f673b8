"""The round's plumbing: vectors chosen by weight, nulls scored over the same candidates as the attack."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attacks.base import AttackTarget
from attacks.evaluation import ReleaseTruth, RoundModel, invert_round, score_round, selected_vectors, split_auxiliary
from attacks.scoring.ground_truth import ClientMemory, VectorTruth
from privfed.errors import PrivfedError


def uint8_images(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 32, 32), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def kanon_target() -> AttackTarget:
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.AvgPool2d(8), nn.Flatten(), nn.Linear(48, 16))
    return AttackTarget(
        round=3, encoder=encoder, mechanism="kanon", mechanism_params={"min_k": 4}, centroids=None,
        num_local_centroids=4, memory_size=32, batch_size=16,
    )


def test_only_vectors_with_weight_are_chosen_and_at_most_as_many_as_asked():
    weights = [torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0]), torch.tensor([5.0, 5.0])]
    g = torch.Generator().manual_seed(0)
    assert selected_vectors(weights, 10, g) == [(0, 0), (0, 2), (2, 0), (2, 1)]
    chosen = selected_vectors(weights, 2, g)
    assert len(chosen) == 2 and set(chosen) <= {(0, 0), (0, 2), (2, 0), (2, 1)}


def test_an_inversion_that_ignores_the_release_has_no_advantage_over_the_null():
    target, aux = kanon_target(), uint8_images(64, 1)
    split = split_auxiliary(aux, 16, torch.Generator().manual_seed(0))
    assert {split.fit.shape[0], split.null.shape[0], split.distractors.shape[0]} == {32, 16}
    client = uint8_images(20, 2)
    vectors = torch.nn.functional.normalize(torch.randn(4, 16), dim=1)
    grey = torch.full((1, 3, 32, 32), 0.5)
    inverted = invert_round(
        [RoundModel(target, lambda v: grey.expand(len(v), -1, -1, -1))], [(vectors, torch.full((4,), 5.0))],
        null_images=split.null, max_vectors=10, generator=torch.Generator().manual_seed(0),
    )
    truth = [ReleaseTruth(ClientMemory(0, client, None, None), [VectorTruth(0, torch.arange(5 * j, 5 * j + 5)) for j in range(4)])]
    summary, figure = score_round(inverted, truth, distractors=split.distractors, single_source=False)
    assert summary["vectors"] == 4 and len(figure) == 4
    for score in ("psnr_best_member", "psnr_mean_member", "ssim_best_member", "psnr_best_client", "reid_rate"):
        assert summary[f"advantage_{score}"] == 0.0
    assert summary["reid_chance"] == pytest.approx(5 / 36)


def test_a_round_whose_vectors_are_all_padding_is_refused_before_anything_runs():
    target = kanon_target()
    with pytest.raises(PrivfedError, match="round 3 has no released vector with weight"):
        invert_round(
            [RoundModel(target, lambda v: pytest.fail("the attack ran"))], [(torch.randn(4, 16), torch.zeros(4))],
            null_images=uint8_images(8, 3), max_vectors=10, generator=torch.Generator(),
        )
