"""Name → mechanism registry.

Built-in mechanisms register themselves on import; third-party packages add
theirs without editing privfed, either by calling :func:`register_mechanism`
or through the ``privfed.mechanisms`` entry-point group::

    [project.entry-points."privfed.mechanisms"]
    mymech = "mypkg.mymech:MyMechanism"
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, TypeVar

from mechanisms.base import Mechanism

ENTRY_POINT_GROUP = "privfed.mechanisms"

_REGISTRY: dict[str, type[Mechanism]] = {}
_entry_points_loaded = False

M = TypeVar("M", bound=type[Mechanism])


class UnknownMechanismError(KeyError):
    """Raised for a mechanism name nobody registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def register_mechanism(cls: M) -> M:
    """Class decorator adding a mechanism under its ``name``."""
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"mechanism name {cls.name!r} is already taken by {existing.__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _REGISTRY:
            register_mechanism(ep.load())


def available_mechanisms() -> dict[str, str]:
    """Installed mechanisms with their one-line descriptions, sorted by name."""
    _load_entry_points()
    return {name: _REGISTRY[name].description for name in sorted(_REGISTRY)}


def get_mechanism_class(name: str) -> type[Mechanism]:
    _load_entry_points()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownMechanismError(f"unknown mechanism {name!r} (installed: {known})") from None


def create_mechanism(name: str, **params: Any) -> Mechanism:
    """Builds a registered mechanism from keyword parameters."""
    return get_mechanism_class(name)(**params)

