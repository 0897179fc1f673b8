"""Inversion attacks of a semi-honest server on what each mechanism releases.

``attacks.attackers`` holds what the server can do with public information
(the models it sent, the releases it got, auxiliary images); ``attacks.scoring``
holds the ground truth it is scored against, which no attacker may import.
``attacks.evaluation`` puts the two together for ``privfed attack``.
"""

import attacks.attackers  # noqa: F401  (registers the built-in attacks)
from attacks.base import Attack, AttackTarget, Inversion
from attacks.registry import UnknownAttackError, available_attacks, get_attack_class, register_attack

__all__ = [
    "Attack",
    "AttackTarget",
    "Inversion",
    "UnknownAttackError",
    "available_attacks",
    "get_attack_class",
    "register_attack",
]
