"""Semi-supervised evaluation (the paper's): fine-tune the backbone and a linear head on 1 % or 10 % of the labels;
every draw comes from ``seed``, so one encoder and seed give one accuracy on CPU."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from privfed.data.augment import normalize, random_resized_crop_flip, to_float
from privfed.evaluation.features import StepProgress
from privfed.evaluation.label_subsets import class_balanced_subset


@dataclass(frozen=True)
class FineTuning:
    """The fine-tuning schedule, one for every encoder so accuracies compare: SGD with momentum, ``lr`` decaying
    to 0 by cosine, crop (smallest fraction ``crop_scale``) and flip augmentation."""

    epochs: int = 30
    batch_size: int = 64
    lr: float = 0.05
    weight_decay: float = 5e-4
    crop_scale: float = 0.5


def fine_tune_accuracy(
    backbone: nn.Module,
    train_images: torch.Tensor,
    train_labels: torch.Tensor,
    test_images: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    fraction: float,
    seed: int,
    device: torch.device,
    schedule: FineTuning = FineTuning(),
    progress: StepProgress | None = None,
) -> tuple[float, int]:
    """Fine-tunes a copy of ``backbone`` with a linear head (a class per label of either split) on ``fraction``
    of the labels; returns (test accuracy, labels used). ``progress`` hears of each epoch."""
    labelled = torch.as_tensor(class_balanced_subset(train_labels.numpy(), fraction, seed=seed))
    images, labels = train_images[labelled], train_labels[labelled]
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    model = _with_head(copy.deepcopy(backbone), images[:2], num_classes, seed).to(device)
    generator = torch.Generator().manual_seed(seed)
    aug_generator = torch.Generator(device=device).manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=schedule.lr, momentum=0.9, weight_decay=schedule.weight_decay)
    whole, rest = divmod(len(labelled), schedule.batch_size)
    steps_per_epoch = max(1, whole + (rest >= 2))  # a trailing batch of one is skipped
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, schedule.epochs * steps_per_epoch)
    model.train()
    for epoch in range(schedule.epochs):
        for index in torch.randperm(len(labelled), generator=generator).split(schedule.batch_size):
            if len(index) < 2:  # BatchNorm needs two
                continue
            batch = to_float(images[index].to(device))
            views = random_resized_crop_flip(batch, generator=aug_generator, scale=(schedule.crop_scale, 1.0))
            loss = F.cross_entropy(model(normalize(views)), labels[index].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
        if progress is not None:
            progress("fine-tuning", epoch + 1, schedule.epochs, {})
    return _accuracy(model, test_images, test_labels, device), len(labelled)


def _with_head(backbone: nn.Module, sample: torch.Tensor, num_classes: int, seed: int) -> nn.Sequential:
    """The backbone followed by a seeded linear classifier on its features."""
    with torch.no_grad():
        backbone.eval()
        width = backbone(normalize(to_float(sample))).shape[1]
    with torch.random.fork_rng(devices=[]):  # the head's draw leaves the caller's generator where it was
        torch.manual_seed(seed)
        head = nn.Linear(width, num_classes)
    return nn.Sequential(backbone, head)


@torch.no_grad()
def _accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device) -> float:
    model.eval()
    predicted = torch.cat([model(normalize(to_float(batch.to(device)))).argmax(1).cpu() for batch in images.split(512)])
    return float((predicted == labels).float().mean())
