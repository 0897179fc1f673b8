"""Name → mechanism registry.

Built-in mechanisms register themselves on import; third-party packages add
theirs without editing privfed, either by calling :func:`register_mechanism`
or through the ``privfed.mechanisms`` entry-point group (:func:`load_plugins`
loads any such group, attacks' too)::

    [project.entry-points."privfed.mechanisms"]
    mymech = "mypkg.mymech:MyMechanism"
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Container
from importlib.metadata import entry_points
from typing import Any, TypeVar

from mechanisms.base import GUARANTEE_KINDS, NO_GUARANTEE, Mechanism, ReleaseMechanism, SecureSumMechanism

ENTRY_POINT_GROUP = "privfed.mechanisms"

_REGISTRY: dict[str, type[Mechanism]] = {}
_loaded_groups: set[str] = set()

M = TypeVar("M", bound=type[Mechanism])


class MechanismRegistrationError(ValueError):
    """A mechanism class, or a plugin's entry point, that cannot be registered as it is."""


class UnknownMechanismError(KeyError):
    """Raised for a mechanism name nobody registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def check_privacy_description(cls: type[Mechanism]) -> None:
    """Refuses a class whose privacy description privfed could not budget or state.

    Raises:
        MechanismRegistrationError: for a class of neither kind or one that changes when its kind sends, an
            unknown guarantee kind, or a
            differentially private mechanism without its own calibration and events.
    """
    if issubclass(cls, ReleaseMechanism) == issubclass(cls, SecureSumMechanism):
        raise MechanismRegistrationError(
            f"mechanism {cls.name!r} must subclass exactly one of mechanisms.base.ReleaseMechanism and SecureSumMechanism"
        )
    kind = ReleaseMechanism if issubclass(cls, ReleaseMechanism) else SecureSumMechanism
    for name in ("releases_in", "max_releases"):
        if inspect.getattr_static(cls, name) is not inspect.getattr_static(kind, name):
            raise MechanismRegistrationError(
                f"mechanism {cls.name!r} overrides {name}, which is its kind's: a {kind.__name__} sends "
                f"{'in every round' if kind is ReleaseMechanism else 'in training rounds only'}"
            )
    if cls.guarantee_kind not in GUARANTEE_KINDS:
        raise MechanismRegistrationError(
            f"mechanism {cls.name!r} has guarantee_kind {cls.guarantee_kind!r}; choose from {', '.join(GUARANTEE_KINDS)}"
        )
    if cls.releases_raw_data and cls.guarantee_kind != NO_GUARANTEE:
        raise MechanismRegistrationError(
            f"mechanism {cls.name!r} releases raw data, so it cannot claim {cls.guarantee_kind!r}"
        )
    if cls.is_differentially_private():
        inherited = [
            name
            for name in ("calibrate", "privacy_events")
            if inspect.getattr_static(cls, name) is inspect.getattr_static(Mechanism, name)
        ]
        if inherited:
            raise MechanismRegistrationError(
                f"mechanism {cls.name!r} declares differential privacy but does not implement {' or '.join(inherited)}"
            )


def register_mechanism(cls: M) -> M:
    """Class decorator adding a mechanism under its ``name``, once its privacy description checks out."""
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise MechanismRegistrationError(f"mechanism name {cls.name!r} is already taken by {existing.__qualname__}")
    check_privacy_description(cls)
    _REGISTRY[cls.name] = cls
    return cls


def load_plugins(group: str, registered: Container[str], register: Callable[[Any], object], error: type[Exception]) -> None:
    """Registers, once per process, every plug-in of the entry-point ``group``; a broken one is named, not skipped.

    Mechanisms and attacks (and anything else named by a ``name`` attribute) load their plug-ins here.
    """
    if group in _loaded_groups:
        return
    for ep in entry_points(group=group):
        if ep.name in registered:
            continue
        try:
            plugin = ep.load()
        except Exception as err:
            raise error(f"{group} plugin {ep.name!r} ({ep.value}) cannot be loaded: {err}") from err
        if getattr(plugin, "name", None) != ep.name:
            raise error(
                f"entry point {ep.name!r} points to {ep.value}, whose name is {getattr(plugin, 'name', None)!r}; "
                "the two must agree"
            )
        register(plugin)
    _loaded_groups.add(group)


def _load_entry_points() -> None:
    load_plugins(ENTRY_POINT_GROUP, _REGISTRY, register_mechanism, MechanismRegistrationError)


def available_mechanisms() -> dict[str, str]:
    """Installed mechanisms with their one-line descriptions, sorted by name."""
    _load_entry_points()
    return {name: _REGISTRY[name].description for name in sorted(_REGISTRY)}


def dp_mechanisms() -> list[str]:
    """The installed mechanisms whose releases are differentially private (those ``--epsilon`` calibrates), by name."""
    return [name for name in available_mechanisms() if _REGISTRY[name].is_differentially_private()]


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

