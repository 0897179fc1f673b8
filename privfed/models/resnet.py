"""CIFAR-style ResNets (3x3 stride-1 stem, no max-pool): ``resnet18`` is the paper's backbone (512-d features);
``resnet8`` and ``resnet20`` (16-32-64 channels, 64-d) make CPU runs finish in minutes."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from privfed.models.norms import norm2d


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, *, norm: str = "batch") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = norm2d(out_channels, norm)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = norm2d(out_channels, norm)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                norm2d(out_channels, norm),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """Backbone mapping ``[B, 3, H, W]`` images to ``[B, feature_dim]`` features."""

    def __init__(
        self, blocks_per_stage: tuple[int, ...], widths: tuple[int, ...], *, norm: str = "batch"
    ) -> None:
        super().__init__()
        if len(blocks_per_stage) != len(widths):
            raise ValueError("one width per stage is required")
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
            norm2d(widths[0], norm),
            nn.ReLU(inplace=norm == "batch"),  # Opacus' backward hooks forbid in-place ops on hooked outputs
        )
        layers: list[nn.Module] = []
        in_channels = widths[0]
        for stage, (num_blocks, width) in enumerate(zip(blocks_per_stage, widths)):
            for block in range(num_blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(in_channels, width, stride, norm=norm))
                in_channels = width
        self.stages = nn.Sequential(*layers)
        self.feature_dim = in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stages(self.stem(x))
        return torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)


#: Backbone builders; each takes a keyword-only ``norm`` ("batch" or "group").
BACKBONES: dict[str, Callable[..., CifarResNet]] = {
    "resnet8": functools.partial(CifarResNet, (1, 1, 1), (16, 32, 64)),
    "resnet20": functools.partial(CifarResNet, (3, 3, 3), (16, 32, 64)),
    "resnet18": functools.partial(CifarResNet, (2, 2, 2, 2), (64, 128, 256, 512)),
}
