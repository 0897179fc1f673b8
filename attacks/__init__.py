"""Inversion attacks of a semi-honest server on what each mechanism releases: ``attacks.attackers`` (public
information only), ``attacks.scoring`` (the ground truth, which no attacker may import), and ``attacks.evaluation``
putting both together for ``privfed attack``."""

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
