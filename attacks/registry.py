"""Name → attack registry (``privfed attack --method NAME``); plug-ins: :func:`register_attack` or (as in
``examples/third_party_attack.py``)::

    [project.entry-points."privfed.attacks"]
    myattack = "mypkg.myattack:MyAttack"
"""

from __future__ import annotations

from typing import TypeVar

from attacks.base import Attack
from mechanisms.registry import load_plugins
from privfed.errors import PrivfedError

ENTRY_POINT_GROUP = "privfed.attacks"

_REGISTRY: dict[str, type[Attack]] = {}

A = TypeVar("A", bound=type[Attack])


class UnknownAttackError(PrivfedError):
    """An attack name nobody registered."""


def register_attack(cls: A) -> A:
    """Class decorator: makes an attack available by its ``name``."""
    name = cls.name if hasattr(cls, "name") else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__qualname__} needs a non-empty class attribute `name`")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"attack name {name!r} is already taken by {_REGISTRY[name].__qualname__}")
    _REGISTRY[name] = cls
    return cls


def get_attack_class(name: str) -> type[Attack]:
    load_plugins(ENTRY_POINT_GROUP, _REGISTRY, register_attack, PrivfedError)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownAttackError(f"unknown attack {name!r} (choose from {', '.join(sorted(_REGISTRY))})") from None


def available_attacks() -> dict[str, str]:
    """Registered attacks and their one-line descriptions, plug-ins included."""
    load_plugins(ENTRY_POINT_GROUP, _REGISTRY, register_attack, PrivfedError)
    return {name: cls.description for name, cls in sorted(_REGISTRY.items())}
