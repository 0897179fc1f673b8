"""Linear probe: a softmax classifier on frozen, precomputed features."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from privfed.evaluation.features import StepProgress


def linear_probe_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    epochs: int = 100,
    lr: float = 0.1,
    weight_decay: float = 1e-5,
    batch_size: int = 256,
    seed: int = 0,
    progress: StepProgress | None = None,
) -> float:
    """Trains a linear classifier on the training features; test accuracy.

    Features are standardised with the training statistics first so one
    learning rate suits every backbone width. ``progress`` hears of each epoch.
    """
    generator = torch.Generator().manual_seed(seed)
    mean, std = train_features.mean(0), train_features.std(0).clamp_min(1e-6)
    x_train = (train_features - mean) / std
    x_test = (test_features - mean) / std
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    classifier = nn.Linear(x_train.shape[1], num_classes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        classifier.reset_parameters()
    optimizer = torch.optim.SGD(classifier.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
    for epoch in range(epochs):
        for index in torch.randperm(x_train.shape[0], generator=generator).split(batch_size):
            loss = F.cross_entropy(classifier(x_train[index]), train_labels[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        scheduler.step()
        if progress is not None:
            progress("linear probe", epoch + 1, epochs, {"loss": float(loss.detach())})
    with torch.no_grad():
        predicted = classifier(x_test).argmax(dim=1)
    return float((predicted == test_labels).float().mean())
