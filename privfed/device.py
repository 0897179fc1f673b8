"""Resolving ``--device auto|cpu|cuda`` to a torch device."""

from __future__ import annotations

import torch

from privfed.errors import PrivfedError


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available; asking for CUDA without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise PrivfedError("--device cuda was requested but no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise PrivfedError(f"unknown device {name!r} (choose from auto, cpu, cuda)")
    return torch.device(name)
