"""Which images a (virtual or real) client holds.

Every simulated client loads the same dataset and cuts its own Dirichlet
partition with the run's seed, so no data crosses processes. Results are
cached per process because Ray reuses client actors across rounds.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from privfed.config import TrainConfig
from privfed.data import dirichlet_partition, load_dataset


@lru_cache(maxsize=4)
def _partition(dataset: str, data_dir: str, num_clients: int, alpha: float, seed: int):
    data = load_dataset(dataset, split="train", data_dir=Path(data_dir))
    parts = dirichlet_partition(data.labels, num_clients=num_clients, alpha=alpha, seed=seed)
    return data, parts


def client_images(config: TrainConfig, client_id: int) -> torch.Tensor:
    """``[n_k, 3, H, W]`` uint8 images of client ``client_id`` under this run's partition."""
    if not 0 <= client_id < config.num_clients:
        raise ValueError(f"client id {client_id} outside 0..{config.num_clients - 1}")
    data, parts = _partition(
        config.dataset, config.data_dir, config.num_clients, config.alpha, config.seed
    )
    return data.subset(parts[client_id]).to_tensor()
