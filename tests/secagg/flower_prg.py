"""Flower's own mask expansion, replaced by one that raises: a test using it shows no code path calls it.

Flower imports ``pseudo_rand_gen`` by name into its client mod and its
server workflow, so it is replaced in every module that holds it.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Every Flower module that holds ``pseudo_rand_gen`` (Flower 1.41).
HOLDERS = (
    "flwr.common.secure_aggregation.secaggplus_utils",
    "flwr.client.mod.secure_aggregation.secaggplus_mod",
    "flwr.server.workflow.secure_aggregation.secaggplus_workflow",
)


class FlowerPrgCalled(AssertionError):
    """Flower's 32-bit mask expansion was called."""


def refuse(*args: Any, **kwargs: Any) -> Any:
    raise FlowerPrgCalled("Flower's pseudo_rand_gen was called")


def replace_flowers_prg(patch: Any) -> None:
    """Replaces Flower's ``pseudo_rand_gen`` with :func:`refuse` wherever Flower holds it (``patch``: a MonkeyPatch)."""
    for holder in HOLDERS:
        module = importlib.import_module(holder)
        assert hasattr(module, "pseudo_rand_gen"), f"{holder} no longer holds pseudo_rand_gen: update HOLDERS"
        patch.setattr(module, "pseudo_rand_gen", refuse)
