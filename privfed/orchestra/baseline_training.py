"""Client side: one round of a baseline's local training (the federated SSL baselines, supervised FedAvg).

The baselines are stateless clients: each round a client starts from the
global model, trains the baseline's loss on two views of its own images and
sends the model delta; the server averages (FedAvg). Nothing else leaves
the client: no memory, no release. BYOL's target network follows the
online network by EMA after every step, as Orchestra's does, and travels
with the model. Supervised FedAvg trains the backbone and a linear
classifier by cross-entropy on one cropped and flipped view per image.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from privfed.baselines.losses import negative_cosine_loss, nt_xent_loss, spectral_contrastive_loss
from privfed.data.augment import normalize, random_resized_crop_flip, to_float, two_views
from privfed.methods import SUPERVISED_LOSS
from privfed.models.network import OrchestraNetwork, ema_update
from privfed.orchestra.local_training import LocalTrainingConfig, LocalTrainingResult, shuffled_batches, step_means
from privfed.orchestra.objective import STEP_VALUES, augmentation_generator

#: Smallest crop fraction of supervised FedAvg's augmentation (crop and flip only).
SUPERVISED_CROP_SCALE = (0.5, 1.0)


def baseline_loss(
    network: OrchestraNetwork, view1: torch.Tensor, view2: torch.Tensor, *, loss: str, temperature: float
) -> torch.Tensor:
    """The baseline's loss on one batch of paired views (the encoder passes included)."""
    if loss == "simclr":
        return nt_xent_loss(network.online(view1), network.online(view2), temperature)
    if loss == "specloss":
        assert network.cluster_head is not None
        z1, z2 = F.normalize(network.online(view1), dim=1), F.normalize(network.online(view2), dim=1)
        return spectral_contrastive_loss(network.cluster_head(z1), network.cluster_head(z2))
    if loss in ("simsiam", "byol"):
        assert network.predictor is not None
        z1, z2 = network.online(view1), network.online(view2)
        p1, p2 = network.predictor(z1), network.predictor(z2)
        if loss == "byol":
            assert network.target is not None
            with torch.no_grad():
                z1, z2 = network.target(view1), network.target(view2)
        return negative_cosine_loss(p1, p2, z1, z2)
    raise ValueError(f"{loss!r} is not a baseline loss")


def supervised_loss(
    network: OrchestraNetwork, images: torch.Tensor, labels: torch.Tensor, *, generator: torch.Generator
) -> torch.Tensor:
    """Cross-entropy of the classifier on one cropped and flipped view of each uint8 image."""
    assert network.classifier is not None
    view = normalize(random_resized_crop_flip(to_float(images), generator=generator, scale=SUPERVISED_CROP_SCALE))
    return F.cross_entropy(network.classifier(network.online.backbone(view)), labels)


def train_baseline_locally(
    network: OrchestraNetwork,
    images: torch.Tensor,
    centroids: torch.Tensor | None,
    config: LocalTrainingConfig,
    *,
    generator: torch.Generator,
    device: torch.device,
    labels: torch.Tensor | None = None,
) -> LocalTrainingResult:
    """Runs ``config.epochs`` epochs of the baseline's loss on one client's images.

    Takes the arguments of :func:`privfed.orchestra.local_training.train_locally`
    so the client can run either; a baseline has no centroids and fills no
    memory, so its result's memory is empty.

    Args:
        network: Global network of the baseline's shape, trained in place.
        images: ``[n, 3, H, W]`` uint8 images of this client.
        centroids: Must be None: the baselines share no centroids.
        config: Local hyperparameters (``temperature`` is SimCLR's).
        generator: CPU generator for shuffling; augmentation randomness is
            drawn from a generator on ``device`` seeded from it.
        device: Where to train.
        labels: ``[n]`` labels of ``images`` (supervised FedAvg only).
    """
    loss_name = config.objective.loss
    if (labels is not None) != (loss_name == SUPERVISED_LOSS):
        raise ValueError(f"labels are for the {SUPERVISED_LOSS} loss alone, not {loss_name}")
    if centroids is not None:
        raise ValueError(f"the {loss_name} baseline trains without global centroids")
    if config.dp_sgd is not None:
        raise ValueError(f"privfed has no DP-SGD trainer for the {loss_name} baseline")
    start = time.perf_counter()
    network.to(device).train()
    aug_generator = augmentation_generator(generator, device)
    optimizer = torch.optim.SGD(
        network.trainable_parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    images = images.to(device)
    totals = torch.zeros(len(STEP_VALUES), device=device)
    nan = torch.full((len(STEP_VALUES) - 1,), float("nan"), device=device)
    steps = 0
    for _ in range(config.epochs):
        for index in shuffled_batches(images.shape[0], config.batch_size, generator):
            batch = images[index.to(device)]
            if labels is not None:
                loss = supervised_loss(network, batch, labels[index].to(device), generator=aug_generator)
            else:
                view1, view2 = two_views(batch, generator=aug_generator)
                loss = baseline_loss(network, view1, view2, loss=loss_name, temperature=config.temperature)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if network.target is not None:
                ema_update(network.target, network.online, config.ema_decay)
            totals += torch.cat([loss.detach().reshape(1), nan])
            steps += 1
    empty = torch.empty(0, network.projection_dim)
    return LocalTrainingResult(
        memory=empty,
        memory_examples=torch.empty(0, dtype=torch.long),
        num_samples=int(images.shape[0]),
        num_steps=steps,
        step_means=step_means(totals, steps),
        seconds=time.perf_counter() - start,
    )
