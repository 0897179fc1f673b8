"""Scores against the images behind a vector, the same scores for the null, and the chance of re-identification."""

from __future__ import annotations

import torch

from attacks.scoring.ground_truth import VectorTruth
from attacks.scoring.image_scores import MAX_PSNR
from attacks.scoring.vector_scores import score_client_vectors


def images(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    small = torch.randint(0, 256, (n, 3, 4, 4), generator=g, dtype=torch.uint8).float()
    return torch.nn.functional.interpolate(small, size=16, mode="nearest").to(torch.uint8)


def test_a_perfect_reconstruction_of_a_source_beats_its_null_and_is_reidentified():
    client, distractors = images(10, 0), images(30, 1)
    exact = client[[2, 7]].float() / 255
    nulls = images(2, 2).float() / 255
    truths = [VectorTruth(0, torch.tensor([2])), VectorTruth(0, torch.tensor([7]))]
    rows = score_client_vectors(exact, nulls, truths, client, distractors, single_source=True)
    for row in rows:
        assert row["psnr_source"] == MAX_PSNR and row["psnr_best_client"] == MAX_PSNR
        assert row["null_psnr_source"] < 15 and row["reid"] == 1.0
        assert row["reid_chance"] == 1 / 40  # one source among 10 client images and 30 distractors
        assert "psnr_best_member" not in row


def test_a_centroid_is_scored_over_its_members_and_its_chance_grows_with_them():
    client, distractors = images(12, 3), images(20, 4)
    members = torch.tensor([0, 4, 5])
    mean_image = client[members].float().mean(dim=0, keepdim=True) / 255
    rows = score_client_vectors(mean_image, mean_image, [VectorTruth(0, members)], client, distractors, single_source=False)
    row = rows[0]
    assert row["psnr_best_member"] >= row["psnr_mean_member"]
    assert row["reid_chance"] == 3 / 32
    # The null here is the reconstruction itself: what the release adds over it is zero.
    assert row["psnr_best_member"] == row["null_psnr_best_member"] and row["reid"] == row["null_reid"]
    # A centroid of one image is still a centroid: scored over its members, not as a source.
    one = score_client_vectors(mean_image, mean_image, [VectorTruth(0, members[:1])], client, distractors, single_source=False)
    assert "psnr_best_member" in one[0] and "psnr_source" not in one[0]


def test_unknown_members_leave_only_the_whole_dataset_scores():
    client, distractors = images(6, 5), images(6, 6)
    recon = client[:1].float() / 255
    row = score_client_vectors(recon, recon, [VectorTruth(0, None)], client, distractors, single_source=False)[0]
    assert set(row) == {"psnr_best_client", "ssim_best_client", "null_psnr_best_client", "null_ssim_best_client"}
