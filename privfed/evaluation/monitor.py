"""kNN monitor the server runs during training on labelled evaluation data."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from privfed.evaluation.features import extract_features
from privfed.evaluation.knn import knn_accuracy


@dataclass
class KnnMonitor:
    """Scores a backbone by the kNN accuracy of its frozen features on labelled uint8 images."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    device: torch.device
    k: int
    temperature: float

    def __call__(self, backbone: nn.Module) -> float:
        train = extract_features(backbone, self.train_images, device=self.device)
        test = extract_features(backbone, self.test_images, device=self.device)
        return knn_accuracy(
            train, self.train_labels, test, self.test_labels, k=self.k, temperature=self.temperature
        )
