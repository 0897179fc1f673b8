"""Weighted k-nearest-neighbour monitor (cosine similarity, temperature vote); ``k`` and the temperature
default in :class:`privfed.config.TrainConfig` only (200 and 0.1, as in the paper)."""

from __future__ import annotations

import torch


@torch.no_grad()
def knn_predict(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    query_features: torch.Tensor,
    *,
    num_classes: int,
    k: int,
    temperature: float,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Predicted class per L2-normalised query: the ``k`` nearest (at most all) vote with weight ``exp(sim / T)``."""
    k = min(k, train_features.shape[0])
    predictions = []
    for queries in query_features.split(chunk_size):
        sims, idx = (queries @ train_features.T).topk(k, dim=1)
        votes = torch.zeros(queries.shape[0], num_classes, dtype=sims.dtype)
        votes.scatter_add_(1, train_labels[idx], (sims / temperature).exp())
        predictions.append(votes.argmax(dim=1))
    return torch.cat(predictions)


def knn_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    k: int,
    temperature: float,
) -> float:
    """Fraction of test points whose weighted kNN vote is the true label."""
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    predicted = knn_predict(
        train_features, train_labels, test_features, num_classes=num_classes, k=k, temperature=temperature
    )
    return float((predicted == test_labels).float().mean())
