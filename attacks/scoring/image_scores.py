"""Per-pair PSNR and SSIM (torchmetrics) of reconstructions against candidates in [0, 1], and re-identification."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

#: Cap on one PSNR: identical images would otherwise score infinity (1e-10 MSE on [0, 1] images).
MAX_PSNR = 100.0


def psnr(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``[n]`` PSNR in dB of ``preds[i]`` against ``target[i]`` (both ``[n, C, H, W]`` in [0, 1])."""
    values = peak_signal_noise_ratio(preds, target, data_range=1.0, reduction="none", dim=(1, 2, 3))
    return values.clamp(max=MAX_PSNR).nan_to_num(MAX_PSNR)


def ssim(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``[n]`` SSIM (Gaussian window 11, sigma 1.5) of ``preds[i]`` against ``target[i]``."""
    values = structural_similarity_index_measure(preds, target, data_range=1.0, reduction="none")
    assert isinstance(values, torch.Tensor)  # a tuple only with return_full_image=True
    return values


def pairwise(
    score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    reconstructions: torch.Tensor,
    candidates: torch.Tensor,
    *,
    chunk: int = 4096,
) -> torch.Tensor:
    """``[m, c]`` ``score`` of every reconstruction against every candidate."""
    m, c = reconstructions.shape[0], candidates.shape[0]
    if m == 0 or c == 0:
        return torch.zeros(m, c)
    rows = torch.arange(m).repeat_interleave(c)
    cols = torch.arange(c).repeat(m)
    values = [score(reconstructions[r], candidates[k]) for r, k in zip(rows.split(chunk), cols.split(chunk))]
    return torch.cat(values).view(m, c)


def reidentified(similarity: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[m]`` whether each row's most similar candidate is one of its targets (``[m, c]`` bool mask)."""
    return targets[torch.arange(similarity.shape[0]), similarity.argmax(dim=1)]
