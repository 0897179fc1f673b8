"""Shared fixtures: tiny, real inputs so tests exercise the actual code paths."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

from privfed.config import TrainConfig, build_config


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(1)


@pytest.fixture
def tiny_config() -> TrainConfig:
    """A configuration small enough for a client round in about a second."""
    return build_config(
        dataset="shapes:300",
        num_clients=4,
        participation=1.0,
        backbone="resnet8",
        projection_dim=16,
        local_epochs=1,
        batch_size=16,
        memory_size=32,
        num_local_centroids=4,
        num_global_centroids=8,
        rounds=1,
    )


@pytest.fixture(scope="session")
def run_privfed() -> Callable[..., subprocess.CompletedProcess]:
    """Runs the real `privfed` CLI in a subprocess, as a user would."""

    def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "privfed.cli", *args], capture_output=True, text=True, timeout=timeout
        )

    return run


@pytest.fixture
def synced(monkeypatch) -> list[tuple[str, bool]]:
    """Every path ``os.fsync`` flushes from now on (the real call still runs), and whether it is a folder."""
    seen: list[tuple[str, bool]] = []
    real = os.fsync

    def spy(fd: int) -> None:
        seen.append((os.readlink(f"/proc/self/fd/{fd}"), stat.S_ISDIR(os.fstat(fd).st_mode)))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen
