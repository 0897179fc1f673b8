"""Each attacked vector's scores, and its null's, over the same candidate sets (docs/attacks.md, "Scores")."""

from __future__ import annotations

import torch

from attacks.scoring.ground_truth import VectorTruth
from attacks.scoring.image_scores import pairwise, psnr, reidentified, ssim
from privfed.data.augment import to_float


def score_client_vectors(
    reconstructions: torch.Tensor,
    nulls: torch.Tensor,
    truths: list[VectorTruth],
    client_images: torch.Tensor,
    distractors: torch.Tensor,
    *,
    single_source: bool,
) -> list[dict[str, float | None]]:
    """Rows of scores for one client's attacked vectors and their nulls, against its images and distractors
    (``single_source``: each vector is one representation, scored against its source)."""
    candidates = to_float(client_images)
    pool = torch.cat([candidates, to_float(distractors)])
    n = candidates.shape[0]
    rows: list[dict[str, float | None]] = [{} for _ in truths]
    for prefix, images in (("", reconstructions), ("null_", nulls)):
        psnr_pool = pairwise(psnr, images, pool)
        ssim_client = pairwise(ssim, images, candidates)
        psnr_client = psnr_pool[:, :n]
        for i, truth in enumerate(truths):
            row = rows[i]
            row[f"{prefix}psnr_best_client"] = float(psnr_client[i].max())
            row[f"{prefix}ssim_best_client"] = float(ssim_client[i].max())
            if truth.members is None or truth.members.numel() == 0:
                continue
            members = truth.members
            if single_source:
                row[f"{prefix}psnr_source"] = float(psnr_client[i, members[0]])
                row[f"{prefix}ssim_source"] = float(ssim_client[i, members[0]])
            else:
                row[f"{prefix}psnr_best_member"] = float(psnr_client[i, members].max())
                row[f"{prefix}psnr_mean_member"] = float(psnr_client[i, members].mean())
                row[f"{prefix}ssim_best_member"] = float(ssim_client[i, members].max())
                row[f"{prefix}ssim_mean_member"] = float(ssim_client[i, members].mean())
            target = torch.zeros(1, pool.shape[0], dtype=torch.bool)
            target[0, members] = True
            row[f"{prefix}reid"] = float(reidentified(psnr_pool[i : i + 1], target)[0])
            row["reid_chance"] = float(members.unique().numel() / pool.shape[0])
    return rows


def best_member(reconstruction: torch.Tensor, truth: VectorTruth, client_images: torch.Tensor) -> torch.Tensor:
    """The member image (or, members unknown, client image) closest to a reconstruction in PSNR."""
    candidates = to_float(client_images)
    if truth.members is not None and truth.members.numel():
        candidates = candidates[truth.members]
    scores = psnr(reconstruction.expand_as(candidates), candidates)
    return candidates[scores.argmax()]
