"""The unsupervised tuning score of the paper's §5 (after Wang & Isola, ICML 2020): ``alignment + 0.2 *
uniformity`` of two views' representations per client, averaged over clients; higher is better. Formulas, and
how they differ from the authors' code: docs/studies.md, "Methods and evaluation protocols".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from privfed.data.augment import two_views

#: The uniformity's weight in the score (paper §5).
UNIFORMITY_WEIGHT = 0.2
#: The uniformity's temperature t.
UNIFORMITY_T = 0.2


def alignment(z1: torch.Tensor, z2: torch.Tensor) -> float:
    """Mean cosine similarity of ``z1[i]`` and ``z2[i]``."""
    _check_views(z1, z2)
    return float(F.cosine_similarity(z1, z2, dim=1).mean())


def uniformity(z1: torch.Tensor, z2: torch.Tensor, *, t: float = UNIFORMITY_T) -> float:
    """``-log(mean exp(t (cos - 1))) / (2t)`` over all pairs of views of different images (both views pooled)."""
    _check_views(z1, z2)
    if z1.shape[0] < 2:
        raise ValueError("uniformity needs at least two images")
    if t <= 0:
        raise ValueError(f"t must be > 0, got {t}")
    views = F.normalize(torch.cat([z1, z2]), dim=1)
    cosines = views @ views.T
    batch = z1.shape[0]
    same_image = torch.eye(batch, dtype=torch.bool, device=views.device).repeat(2, 2)
    log_mean = torch.logsumexp(t * (cosines[~same_image] - 1), dim=0) - math.log(int((~same_image).sum()))
    return float(-log_mean / (2 * t))


def tuning_score(align: float, unif: float, *, weight: float = UNIFORMITY_WEIGHT) -> float:
    """``alignment + weight * uniformity``: higher is better."""
    return align + weight * unif


@dataclass(frozen=True)
class AlignUniform:
    """The score's parts for one client (or their mean over clients)."""

    alignment: float
    uniformity: float

    @property
    def score(self) -> float:
        return tuning_score(self.alignment, self.uniformity)


@torch.no_grad()
def client_align_uniform(
    encoder: nn.Module,
    images: torch.Tensor,
    *,
    batch_size: int,
    seed: int,
    device: torch.device,
) -> AlignUniform:
    """The online ``encoder``'s alignment and uniformity on one client's uint8 images, averaged over batches
    (a trailing batch of one joins the previous one)."""
    if images.shape[0] < 2:
        raise ValueError("a client needs at least two images to be scored")
    was_training = encoder.training
    encoder.to(device).eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    starts = list(range(0, images.shape[0], batch_size))
    if images.shape[0] - starts[-1] < 2 and len(starts) > 1:
        starts.pop()
    aligns, unifs = [], []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else images.shape[0]
        view1, view2 = two_views(images[start:end].to(device), generator=generator)
        z1, z2 = F.normalize(encoder(view1), dim=1), F.normalize(encoder(view2), dim=1)
        aligns.append(alignment(z1, z2))
        unifs.append(uniformity(z1, z2))
    encoder.train(was_training)
    return AlignUniform(sum(aligns) / len(aligns), sum(unifs) / len(unifs))


def mean_over_clients(scores: list[AlignUniform]) -> AlignUniform:
    """Every client counts once, whatever its size (the score is about each client's view of the model)."""
    if not scores:
        raise ValueError("no client to average")
    return AlignUniform(
        sum(s.alignment for s in scores) / len(scores), sum(s.uniformity for s in scores) / len(scores)
    )


def _check_views(z1: torch.Tensor, z2: torch.Tensor) -> None:
    if z1.ndim != 2 or z1.shape != z2.shape:
        raise ValueError(f"expected two [B, D] tensors of one shape, got {tuple(z1.shape)} and {tuple(z2.shape)}")
