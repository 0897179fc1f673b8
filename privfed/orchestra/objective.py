"""Orchestra's objective on one batch, shared by plain and DP-SGD local training."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from privfed.data.augment import OrchestraViews
from privfed.methods import Objective
from privfed.models.network import OrchestraNetwork
from privfed.orchestra.loss import (
    cluster_consistency_loss,
    mean_best_cosine,
    normalised_target_entropy,
    rotation_loss,
)

#: What :meth:`StepLosses.detached` stacks, in order (the names local training reports).
STEP_VALUES = ("loss", "cluster_loss", "rotation_loss", "target_entropy", "centroid_cosine")


@dataclass(frozen=True)
class StepLosses:
    """Orchestra's objective on one batch, the target representations it used, and whether clustering bites.

    ``target_entropy`` (normalised, 1 = uniform targets) and
    ``centroid_cosine`` (mean cosine of a target representation to its
    nearest global centroid) carry no gradient: they say whether the global
    centroids are teaching the encoder anything. A method without centroids
    has no targets: then ``target_reps`` is None and both are NaN, which
    :func:`privfed.orchestra.local_training.step_means` leaves out.
    """

    total: torch.Tensor
    cluster: torch.Tensor
    rotation: torch.Tensor
    target_reps: torch.Tensor | None
    target_entropy: torch.Tensor
    centroid_cosine: torch.Tensor

    def detached(self) -> torch.Tensor:
        """The :data:`STEP_VALUES` of this step, as one tensor to sum over steps."""
        values = (self.total, self.cluster, self.rotation, self.target_entropy, self.centroid_cosine)
        return torch.stack([v.detach() for v in values])


def cluster_targets(network: OrchestraNetwork, images: torch.Tensor, objective: Objective) -> torch.Tensor:
    """L2-normalised representations that set the cluster targets and fill the memory, without gradient.

    The EMA target encoder makes them in Orchestra; the no-target ablation
    uses the online encoder itself.
    """
    if objective.ema_targets:
        return network.target_representation(images)
    with torch.no_grad():
        return F.normalize(network.online_embedding(images), dim=1)


def orchestra_losses(
    network: OrchestraNetwork,
    views: OrchestraViews,
    centroids: torch.Tensor | None,
    temperature: float,
    objective: Objective,
) -> StepLosses:
    """The encoder passes of one step and the loss they give.

    Orchestra runs three: target on view 1, online on view 2 (cluster loss),
    online on the rotated view 3 (rotation loss); an ablation skips the
    passes of a term it switches off. A term that is off is reported as 0.
    Each sample's loss depends on that sample alone once the network has no
    BatchNorm, which is what DP-SGD's per-sample gradients need: the cluster
    targets are per-sample softmaxes, no batch-level balancing.
    """
    zero = torch.zeros((), device=views.view1.device)
    nan = torch.full((), float("nan"), device=views.view1.device)
    target_reps = None
    l_cluster = l_rotation = zero
    entropy = cosine = nan
    if objective.cluster_loss:
        if centroids is None:
            raise ValueError("the cluster loss needs global centroids")
        target_reps = cluster_targets(network, views.view1, objective)
        online_reps = F.normalize(network.online_embedding(views.view2), dim=1)
        l_cluster = cluster_consistency_loss(target_reps, online_reps, centroids, temperature)
        entropy = normalised_target_entropy(target_reps, centroids, temperature)
        cosine = mean_best_cosine(target_reps, centroids)
    if objective.rotation_loss:
        if network.rotation is None:
            raise ValueError("the rotation loss needs a rotation head")
        rotation_logits = network.rotation(network.online_embedding(views.view3))
        l_rotation = rotation_loss(rotation_logits, views.rotation_labels)
    return StepLosses(
        l_cluster + l_rotation, l_cluster, l_rotation, target_reps, target_entropy=entropy, centroid_cosine=cosine
    )


def augmentation_generator(generator: torch.Generator, device: torch.device) -> torch.Generator:
    """A generator on ``device`` for the views, seeded from the round's ``generator``."""
    aug_generator = torch.Generator(device=device)
    aug_generator.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
    return aug_generator
