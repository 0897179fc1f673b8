"""The built-in attacks: an :class:`attacks.base.AttackTarget` and auxiliary images, nothing else (no
:mod:`attacks.scoring`, no dataset, no run directory: ``tests/attacks/test_layering.py``)."""

from attacks.attackers.cross_round import CrossRoundUnmixing
from attacks.attackers.decoder import DecoderAttack, ReleaseDecoderAttack
from attacks.attackers.optimization import OptimizationAttack

__all__ = ["CrossRoundUnmixing", "DecoderAttack", "OptimizationAttack", "ReleaseDecoderAttack"]
