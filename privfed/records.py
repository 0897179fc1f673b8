"""Typed reads of Flower record entries: what a peer sent is read as the protocol's type, anything else refused."""

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
