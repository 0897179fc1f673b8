"""The methods' per-batch losses, as pure functions.

Orchestra's cluster and rotation terms, and the losses the Orchestra
authors' code trains its f-SimCLR, f-SimSiam, f-BYOL and f-SpecLoss
baselines with. SimCLR's and SpecLoss's losses compare every sample with
every other sample of the batch, so one example changes every other
example's loss: they cannot be trained with DP-SGD's per-sample clipping
(such methods declare ``couples_batch``). Orchestra's targets are
per-sample softmaxes, so its batch loss is a mean of per-sample losses.
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
    """Cross-entropy between the target's and the online's cluster assignments.

    ``H(softmax(mu . t / tau), softmax(mu . o / tau))``: the online encoder on
    one view must predict which global cluster the target encoder put the
    other view in. The target side carries no gradient.

    Each sample's targets come from its own representation (a softmax, no
    batch-level Sinkhorn balancing), so the batch loss is the mean of
    per-sample losses: what DP-SGD's per-sample gradients require.

    Args:
        target_reps: ``[B, D]`` L2-normalised target representations of view 1.
        online_reps: ``[B, D]`` L2-normalised online representations of view 2.
        centroids: ``[G, D]`` L2-normalised global centroids.
        temperature: Softmax temperature ``tau`` (0.1 in the authors' code;
            the paper does not state one).
    """
    target_probs = F.softmax(target_reps.detach() @ centroids.T / temperature, dim=1)
    online_log_probs = F.log_softmax(online_reps @ centroids.T / temperature, dim=1)
    return -(target_probs * online_log_probs).sum(dim=1).mean()


@torch.no_grad()
def normalised_target_entropy(target_reps: torch.Tensor, centroids: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean entropy of the cluster targets over ``log G``: 1 when they are uniform, 0 when one-hot.

    Near 1 the cluster loss teaches nothing: every centroid is as likely as
    any other (DESIGN §4 reads this with :func:`mean_best_cosine` every round).
    """
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
