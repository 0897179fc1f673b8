"""Frozen-backbone features for the kNN monitor and the linear probe."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from privfed.data.augment import normalize, to_float

#: ``progress(stage, done, total, figures)``: how a protocol's training reports its epochs (the CLI draws a bar).
StepProgress = Callable[[str, int, int, dict[str, float]], None]


@torch.no_grad()
def extract_features(
    backbone: nn.Module,
    images: torch.Tensor,
    *,
    device: torch.device,
    batch_size: int = 512,
) -> torch.Tensor:
    """L2-normalised backbone features of un-augmented uint8 images, on the CPU."""
    was_training = backbone.training
    backbone.to(device).eval()
    chunks = [
        F.normalize(backbone(normalize(to_float(batch.to(device)))), dim=1).cpu()
        for batch in images.split(batch_size)
    ]
    backbone.train(was_training)
    return torch.cat(chunks)
