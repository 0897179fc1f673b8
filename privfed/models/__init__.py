"""Backbones, heads and the Orchestra online/target network."""

from privfed.models.network import Encoder, OrchestraNetwork, build_network, ema_update, network_norm
from privfed.models.norms import NORMS
from privfed.models.resnet import BACKBONES, CifarResNet

__all__ = [
    "BACKBONES",
    "NORMS",
    "CifarResNet",
    "Encoder",
    "OrchestraNetwork",
    "build_network",
    "ema_update",
    "network_norm",
]
