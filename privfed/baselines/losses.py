"""The federated SSL baselines' per-batch losses, as pure functions.

Each follows the loss the Orchestra authors' code trains its f-SimCLR,
f-SimSiam, f-BYOL and f-SpecLoss baselines with. SimCLR's and SpecLoss's
losses compare every sample with every other sample of the batch, so one
example changes every other example's loss: they cannot be trained with
DP-SGD's per-sample clipping (:func:`privfed.methods.Objective` says which
losses couple a batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def nt_xent_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's normalised temperature-scaled cross-entropy over the ``2B`` views of a batch.

    Each view must pick its partner (the other view of the same image) out
    of the ``2B - 1`` other views, by cosine similarity over ``temperature``;
    the loss is the mean cross-entropy of that choice over all ``2B`` views.

    Args:
        z1: ``[B, D]`` projector outputs of the first views.
        z2: ``[B, D]`` projector outputs of the second views (row i pairs with ``z1[i]``).
        temperature: Softmax temperature.
    """
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
    """The symmetric negative cosine of SimSiam and BYOL: each view's prediction chases the other view's target.

    ``-(cos(p1, z2) + cos(p2, z1)) / 2``, averaged over the batch; the
    targets ``z`` carry no gradient (SimSiam's stop-gradient; in BYOL they
    come from the EMA target network anyway). It lies in ``[-1, 1]`` and is
    -1 when every prediction points along its target.

    Args:
        p1, p2: ``[B, D]`` predictor outputs of views 1 and 2.
        z1, z2: ``[B, D]`` targets of views 1 and 2.
    """
    _check_pair(p1, z2)
    _check_pair(p2, z1)
    cos_12 = F.cosine_similarity(p1, z2.detach(), dim=1).mean()
    cos_21 = F.cosine_similarity(p2, z1.detach(), dim=1).mean()
    return -(cos_12 + cos_21) / 2


def spectral_contrastive_loss(a1: torch.Tensor, a2: torch.Tensor) -> torch.Tensor:
    """SpecLoss: pull the two views of an image together, push the squared similarity of other pairs to 0.

    With ``S[i, j]`` the cosine similarity of ``a1[i]`` and ``a2[j]``, the
    loss is ``-2 mean_i S[i, i] + mean_{i != j} S[i, j]^2``: -2 at best
    (views aligned, different images orthogonal).

    Args:
        a1: ``[B, C]`` outputs of view 1 (the authors' code passes the
            normalised projector output through a linear layer with one
            output per global cluster first).
        a2: ``[B, C]`` the same for view 2.
    """
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
