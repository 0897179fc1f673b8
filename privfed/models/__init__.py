"""Backbones, heads and the network that carries the heads a method declares."""

from privfed.models.heads import Heads, HeadShape
from privfed.models.network import Encoder, OrchestraNetwork, ema_update, network_norm
from privfed.models.norms import NORMS
from privfed.models.resnet import BACKBONES, CifarResNet

__all__ = [
    "BACKBONES",
    "NORMS",
    "CifarResNet",
    "Encoder",
    "HeadShape",
    "Heads",
    "OrchestraNetwork",
    "ema_update",
    "network_norm",
]
