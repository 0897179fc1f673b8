"""What the server can do with public information: the built-in attacks.

Nothing in this package may import :mod:`attacks.scoring`, load a dataset or
read a run directory: an attack gets an :class:`attacks.base.AttackTarget`
and auxiliary images, nothing else (``tests/attacks/test_layering.py``).
"""

from attacks.attackers.decoder import DecoderAttack, ReleaseDecoderAttack
from attacks.attackers.optimization import OptimizationAttack

__all__ = ["DecoderAttack", "OptimizationAttack", "ReleaseDecoderAttack"]
