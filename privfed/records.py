"""Typed reads of Flower record entries.

Flower types every record value as any scalar or list of scalars, and what
a peer sent is not to be trusted: these read one entry as the type the
protocol says, and refuse anything else instead of converting it.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T", int, bytes)


def record_item(value: object, kind: type[T]) -> T:
    """``value`` if it is a ``kind`` (a bool is no int); ValueError otherwise."""
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def record_list(value: object, kind: type[T]) -> list[T]:
    """``value`` if it is a list of ``kind`` items; ValueError otherwise."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of {kind.__name__}, got {type(value).__name__}")
    return [record_item(item, kind) for item in value]
