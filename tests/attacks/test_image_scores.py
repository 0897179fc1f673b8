"""The PSNR/SSIM glue on cases whose answer is known without torchmetrics."""

from __future__ import annotations

import math

import torch

from attacks.scoring.image_scores import MAX_PSNR, pairwise, psnr, reidentified, ssim


def smooth_images(n: int, seed: int = 0) -> torch.Tensor:
    """Images with structure (blurred noise), in [0.2, 0.8] so offsets stay inside [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, 8, 8, generator=g)
    x = torch.nn.functional.interpolate(x, size=32, mode="bilinear", align_corners=False)
    return 0.2 + 0.6 * x


def test_identical_images_score_the_cap_and_ssim_one():
    x = smooth_images(3)
    assert torch.equal(psnr(x, x), torch.full((3,), MAX_PSNR))
    assert torch.allclose(ssim(x, x), torch.ones(3), atol=1e-5)


def test_a_constant_offset_gives_the_psnr_of_its_squared_error():
    x = smooth_images(2)
    for offset in (0.01, 0.1):
        expected = 10 * math.log10(1 / offset**2)
        assert torch.allclose(psnr(x + offset, x), torch.full((2,), expected), atol=1e-3)
    # SSIM sees the brightness change but keeps the structure: below 1, far above unrelated images.
    shifted = ssim(x + 0.1, x)
    assert bool((shifted < 0.999).all()) and bool((shifted > ssim(smooth_images(2, seed=9), x) + 0.3).all())


def test_a_one_pixel_shift_scores_what_its_mean_squared_error_says():
    x = smooth_images(2)
    moved = torch.roll(x, shifts=1, dims=3)
    mse = ((moved - x) ** 2).mean(dim=(1, 2, 3))
    assert torch.allclose(psnr(moved, x), 10 * torch.log10(1 / mse), atol=1e-3)
    assert bool((ssim(moved, x) < ssim(x, x)).all())


def test_pairwise_scores_every_pair_in_order():
    a, b = smooth_images(2, seed=1), smooth_images(3, seed=2)
    table = pairwise(psnr, a, b, chunk=4)  # chunks smaller than the table
    assert table.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            assert torch.isclose(table[i, j], psnr(a[i : i + 1], b[j : j + 1])[0])


def test_reidentification_is_whether_the_top_candidate_is_a_target():
    similarity = torch.tensor([[0.1, 0.9, 0.2], [0.8, 0.1, 0.3]])
    targets = torch.tensor([[False, True, False], [False, False, True]])
    assert reidentified(similarity, targets).tolist() == [True, False]
