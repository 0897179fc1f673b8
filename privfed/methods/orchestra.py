"""Orchestra and its ablations (does the clustering matter?): the cluster and/or rotation term on three views.

Methods that do not cluster (``rotpred``, ``orchestra-fixed-centroids``) release nothing, only model updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from privfed.data.augment import ORCHESTRA_VIEW_DRAWS, OrchestraViews, orchestra_views_from
from privfed.methods.base import CLUSTERED, FIXED_RANDOM, NO_CENTROIDS, Method, StepOutput
from privfed.methods.losses import cluster_consistency_loss, mean_best_cosine, normalised_target_entropy, rotation_loss
from privfed.models.heads import ORCHESTRA_HEADS, Heads
from privfed.models.network import OrchestraNetwork


@dataclass(frozen=True, kw_only=True)
class Orchestra(Method):
    """Orchestra's objective: the cluster term, the rotation term, or both (every variant keeps Orchestra's heads)."""

    heads: Heads = ORCHESTRA_HEADS
    centroids: str = CLUSTERED
    ema_targets: bool = True
    cluster_loss: bool = True
    rotation_loss: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.cluster_loss or self.rotation_loss):
            raise ValueError("an objective needs the cluster loss, the rotation loss or both")
        if self.cluster_loss != (self.centroids != NO_CENTROIDS):
            raise ValueError("the cluster loss needs global centroids, and global centroids need the cluster loss")

    @property
    def loss(self) -> str:
        return "orchestra"

    @property
    def step_values(self) -> tuple[str, ...]:
        return ("loss", "cluster_loss", "rotation_loss") + (("target_entropy", "centroid_cosine") if self.cluster_loss else ())

    @property
    def untrained_heads(self) -> tuple[str, ...]:
        return () if self.rotation_loss else ("rotation",)

    @property
    def view_draw_count(self) -> int:
        return ORCHESTRA_VIEW_DRAWS

    def views_from(self, images: torch.Tensor, draws: torch.Tensor) -> OrchestraViews:
        return orchestra_views_from(images, draws)

    def step_on_views(
        self, network: OrchestraNetwork, views: OrchestraViews, centroids: torch.Tensor | None, temperature: float
    ) -> StepOutput:
        """Target on view 1, online on view 2 (cluster term), online on the rotated view 3; a term that is off is 0.
        Without BatchNorm each sample's loss depends on that sample alone, as DP-SGD needs."""
        zero = torch.zeros((), device=views.view1.device)
        l_cluster = l_rotation = zero
        target_reps, diagnostics = None, {}
        if self.cluster_loss:
            if centroids is None:
                raise ValueError("the cluster loss needs global centroids")
            target_reps = self.representations(network, views.view1)
            online_reps = F.normalize(network.online(views.view2), dim=1)
            l_cluster = cluster_consistency_loss(target_reps, online_reps, centroids, temperature)
            diagnostics = {
                "target_entropy": normalised_target_entropy(target_reps, centroids, temperature),
                "centroid_cosine": mean_best_cosine(target_reps, centroids),
            }
        if self.rotation_loss:
            l_rotation = rotation_loss(network.head("rotation")(network.online(views.view3)), views.rotation_labels)
        total = l_cluster + l_rotation
        return StepOutput(total, {"loss": total, "cluster_loss": l_cluster, "rotation_loss": l_rotation, **diagnostics}, target_reps)


ORCHESTRA = Orchestra(name="orchestra", description="Orchestra: clustering-based federated self-supervised learning")
ORCHESTRA_METHODS = (
    ORCHESTRA,
    Orchestra(name="rotpred", description="ablation: rotation prediction only, no centroids, nothing released (the paper's RotPred)",
              cluster_loss=False, centroids=NO_CENTROIDS),
    Orchestra(name="orchestra-no-rotation", description="ablation: Orchestra without the rotation head's loss", rotation_loss=False),
    Orchestra(name="orchestra-no-target", ema_targets=False,
              description="ablation: Orchestra without the target network (the online encoder makes the cluster targets)"),
    Orchestra(name="orchestra-fixed-centroids", centroids=FIXED_RANDOM,
              description="control: Orchestra against global centroids drawn at random once (clustering off, nothing released)"),
)
