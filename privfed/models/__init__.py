"""Backbones, heads and the Orchestra online/target network."""

from privfed.models.network import Encoder, OrchestraNetwork, ema_update
from privfed.models.resnet import BACKBONES, CifarResNet

__all__ = ["BACKBONES", "CifarResNet", "Encoder", "OrchestraNetwork", "ema_update"]
