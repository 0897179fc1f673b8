"""The paper's federated SSL baselines (f-SimCLR, f-SimSiam, f-BYOL, f-SpecLoss) and supervised FedAvg.

Stateless clients: each trains the baseline's loss on two views of its images
from the global model and sends only the delta (FedAvg; no memory, no
release). BYOL's EMA target travels with the model. Supervised FedAvg, the
upper reference, trains a linear classifier on one cropped and flipped view.
Heads have the authors' code's shapes, scaled to D and the hidden width H.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from privfed.data.augment import TWO_VIEW_DRAWS, normalize, random_resized_crop_flip, to_float, two_views_from
from privfed.errors import PrivfedError
from privfed.methods.base import Batch, Method, StepOutput
from privfed.methods.losses import negative_cosine_loss, nt_xent_loss, spectral_contrastive_loss
from privfed.models.heads import Heads, HeadShape, mlp_head, simsiam_projector
from privfed.models.network import OrchestraNetwork

#: Smallest crop fraction of supervised FedAvg's augmentation (crop and flip only).
SUPERVISED_CROP_SCALE = (0.5, 1.0)

NEEDS_CLUSTERS = "SpecLoss's cluster head needs num_clusters (the run's number of global centroids)"
NEEDS_CLASSES = "supervised FedAvg's classifier needs num_classes"

PairLoss = Callable[[OrchestraNetwork, torch.Tensor, torch.Tensor, float], torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class TwoViews(Method):
    """A baseline trained by ``pair_loss`` on two augmented views of each image."""

    pair_loss: PairLoss

    @property
    def view_draw_count(self) -> int:
        return TWO_VIEW_DRAWS

    def views_from(self, images: torch.Tensor, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return two_views_from(images, draws)

    def step_on_views(
        self, network: OrchestraNetwork, views: tuple[torch.Tensor, torch.Tensor], centroids: torch.Tensor | None, temperature: float
    ) -> StepOutput:
        loss = self.pair_loss(network, *views, temperature)
        return StepOutput(loss, {"loss": loss})


@dataclass(frozen=True, kw_only=True)
class Supervised(Method):
    """Cross-entropy of the classifier on one cropped and flipped view of each image."""

    reads_labels: bool = True

    def step(self, network: OrchestraNetwork, batch: Batch) -> StepOutput:
        assert batch.labels is not None  # the loop hands labels to a method that reads them
        view = normalize(random_resized_crop_flip(to_float(batch.images), generator=batch.generator, scale=SUPERVISED_CROP_SCALE))
        loss = F.cross_entropy(network.head("classifier")(network.online.backbone(view)), batch.labels)
        return StepOutput(loss, {"loss": loss})


def _simclr(network: OrchestraNetwork, view1: torch.Tensor, view2: torch.Tensor, temperature: float) -> torch.Tensor:
    return nt_xent_loss(network.online(view1), network.online(view2), temperature)


def _specloss(network: OrchestraNetwork, view1: torch.Tensor, view2: torch.Tensor, _: float) -> torch.Tensor:
    head = network.head("cluster_head")
    z1, z2 = F.normalize(network.online(view1), dim=1), F.normalize(network.online(view2), dim=1)
    return spectral_contrastive_loss(head(z1), head(z2))


def _predictor_loss(network: OrchestraNetwork, view1: torch.Tensor, view2: torch.Tensor, _: float) -> torch.Tensor:
    """SimSiam's and BYOL's: a predictor chases the other view's projection (BYOL's from its EMA target, without gradient)."""
    predictor = network.head("predictor")
    z1, z2 = network.online(view1), network.online(view2)
    p1, p2 = predictor(z1), predictor(z2)
    if network.target is not None:
        with torch.no_grad():
            z1, z2 = network.target(view1), network.target(view2)
    return negative_cosine_loss(p1, p2, z1, z2)


def _linear(inputs: int, outputs: int | None, missing: str) -> nn.Linear:
    if outputs is None:
        raise PrivfedError(missing)
    return nn.Linear(inputs, outputs)


def _predictor(width: int) -> Callable[[HeadShape], nn.Module]:
    return lambda s: mlp_head(s.dim, s.dim, hidden_dim=width * s.hidden, norm=s.norm)


BASELINES = (
    TwoViews(name="simclr", pair_loss=_simclr, couples_batch=True,
             description="f-SimCLR: NT-Xent contrast of two views against the batch's other images (FedAvg, nothing released)"),
    TwoViews(name="simsiam", pair_loss=_predictor_loss,
             description="f-SimSiam: a predictor chases the other view's stop-gradient projection (FedAvg, nothing released)",
             heads=Heads(projector=lambda s: simsiam_projector(s.features, s.dim, hidden_dim=s.hidden, norm=s.norm),
                         others=(("predictor", _predictor(1)),))),
    TwoViews(name="byol", pair_loss=_predictor_loss, ema_targets=True,
             description="f-BYOL: a predictor chases an EMA target network's projection of the other view (FedAvg, nothing released)",
             heads=Heads(projector=lambda s: mlp_head(s.features, s.dim, hidden_dim=2 * s.hidden, norm=s.norm, bias=False),
                         target=True, others=(("predictor", _predictor(2)),))),
    TwoViews(name="specloss", pair_loss=_specloss, couples_batch=True,
             description="f-SpecLoss: spectral contrastive loss on a linear cluster head (FedAvg, nothing released)",
             heads=Heads(others=(("cluster_head", lambda s: _linear(s.dim, s.num_clusters, NEEDS_CLUSTERS)),), clusters=True)),
    Supervised(name="supervised",
               description="supervised FedAvg: cross-entropy on the clients' own labels, the upper reference (nothing released)",
               heads=Heads(projector=lambda s: nn.Identity(), classes=True,
                           others=(("classifier", lambda s: _linear(s.features, s.num_classes, NEEDS_CLASSES)),))),
)
