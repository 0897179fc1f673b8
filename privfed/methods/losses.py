"""The methods' per-batch losses, as pure functions: Orchestra's terms and the authors' code's baselines'.

SimCLR's and SpecLoss's compare every sample with the rest of the batch (their methods declare ``couples_batch``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def cluster_consistency_loss(
    target_reps: torch.Tensor,
    online_reps: torch.Tensor,
    centroids: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """``H(softmax(mu . t / tau), softmax(mu . o / tau))``: the online encoder on view 2 predicts the global
    cluster the target put view 1 in (no gradient through the target; all inputs L2-normalised).

    Each sample's target is its own softmax (no batch-level Sinkhorn), so the batch loss is a mean of
    per-sample losses, as DP-SGD requires.
    """
    target_probs = F.softmax(target_reps.detach() @ centroids.T / temperature, dim=1)
    online_log_probs = F.log_softmax(online_reps @ centroids.T / temperature, dim=1)
    return -(target_probs * online_log_probs).sum(dim=1).mean()


@torch.no_grad()
def normalised_target_entropy(target_reps: torch.Tensor, centroids: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean entropy of the cluster targets over ``log G``: 1 when uniform (the loss teaches nothing), 0 when one-hot."""
    probs = F.softmax(target_reps @ centroids.T / temperature, dim=1)
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(dim=1).mean()
    return entropy / math.log(centroids.shape[0]) if centroids.shape[0] > 1 else torch.zeros_like(entropy)


@torch.no_grad()
def mean_best_cosine(reps: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Mean over representations of the cosine to their nearest centroid (all inputs L2-normalised)."""
    return (reps @ centroids.T).max(dim=1).values.mean()


def rotation_loss(logits: torch.Tensor, quarter_turns: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of predicting the applied rotation (guards against collapse)."""
    return F.cross_entropy(logits, quarter_turns)


def nt_xent_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's NT-Xent: the mean cross-entropy of each of the ``2B`` views picking its partner (``z1[i]`` and
    ``z2[i]``) out of the other ``2B - 1`` by cosine over ``temperature``."""
    _check_pair(z1, z2)
    if z1.shape[0] < 2:
        raise ValueError("NT-Xent needs at least two images (one positive, one negative)")
    views = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = views @ views.T / temperature
    logits = logits.masked_fill(torch.eye(views.shape[0], dtype=torch.bool, device=views.device), float("-inf"))
    batch = z1.shape[0]
    partner = torch.cat([torch.arange(batch, 2 * batch), torch.arange(batch)]).to(views.device)
    return F.cross_entropy(logits, partner)


def negative_cosine_loss(p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """SimSiam's and BYOL's ``-(cos(p1, z2) + cos(p2, z1)) / 2`` over the batch: -1 when every prediction points
    along the other view's target. The targets carry no gradient (SimSiam's stop-gradient)."""
    _check_pair(p1, z2)
    _check_pair(p2, z1)
    cos_12 = F.cosine_similarity(p1, z2.detach(), dim=1).mean()
    cos_21 = F.cosine_similarity(p2, z1.detach(), dim=1).mean()
    return -(cos_12 + cos_21) / 2


def spectral_contrastive_loss(a1: torch.Tensor, a2: torch.Tensor) -> torch.Tensor:
    """SpecLoss ``-2 mean_i S[i, i] + mean_{i != j} S[i, j]^2``, ``S`` the cosines of ``a1[i]`` and ``a2[j]``:
    -2 at best (views aligned, different images orthogonal)."""
    _check_pair(a1, a2)
    batch = a1.shape[0]
    if batch < 2:
        raise ValueError("the spectral contrastive loss needs at least two images (one positive, one negative)")
    similarity = F.normalize(a1, dim=1) @ F.normalize(a2, dim=1).T
    off_diagonal = ~torch.eye(batch, dtype=torch.bool, device=similarity.device)
    return -2 * similarity.diagonal().mean() + similarity[off_diagonal].pow(2).mean()


def _check_pair(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"expected two [B, D] tensors of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
