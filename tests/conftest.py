"""Shared fixtures: tiny, real inputs so tests exercise the actual code paths."""

from __future__ import annotations

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
