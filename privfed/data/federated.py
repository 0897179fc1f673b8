"""The federated split: which images each client holds.

The server (client sizes, the kNN monitor's reference set) and every client (its own images) ask the same
:class:`FederatedSplit`, so they cannot disagree. No data crosses processes: each loads the dataset and cuts the
seeded split itself, cached per process because Flower's simulation reuses client workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch

from privfed.data.arrays import ImageArrays
from privfed.data.datasets import load_dataset
from privfed.data.partition import dirichlet_partition


class SplitOptions(Protocol):
    """The run options that fix the split (a :class:`privfed.config.TrainConfig` has them)."""

    @property
    def dataset(self) -> str: ...
    @property
    def data_dir(self) -> str: ...
    @property
    def download(self) -> bool: ...
    @property
    def num_clients(self) -> int: ...
    @property
    def alpha(self) -> float: ...
    @property
    def seed(self) -> int: ...


@lru_cache(maxsize=4)
def cached_dataset(
    spec: str, split: Literal["train", "test"], data_dir: str, download: bool, seed: int = 0
) -> ImageArrays:
    """:func:`privfed.data.load_dataset`, loaded once per process (``seed`` draws a ``cifar10:N`` subset)."""
    return load_dataset(spec, split=split, data_dir=Path(data_dir), download=download, seed=seed)


@dataclass(frozen=True)
class FederatedSplit:
    """One dataset's training split, cut across ``num_clients`` clients by a Dirichlet(``alpha``) draw; ``seed``
    draws it (and a ``cifar10:N`` subset)."""

    dataset: str
    data_dir: str
    download: bool
    num_clients: int
    alpha: float
    seed: int

    @classmethod
    def of(cls, config: SplitOptions) -> FederatedSplit:
        """The split a run configuration describes."""
        return cls(config.dataset, config.data_dir, config.download, config.num_clients, config.alpha, config.seed)

    def train_data(self) -> ImageArrays:
        """The whole training split, before partitioning."""
        return cached_dataset(self.dataset, "train", self.data_dir, self.download, self.seed)

    def partition(self) -> list[np.ndarray]:
        """Each client's sample indices into :meth:`train_data`."""
        return _partition(self)

    def client_sizes(self) -> list[int]:
        return [len(part) for part in self.partition()]

    def client_images(self, client_id: int) -> torch.Tensor:
        """``[n_k, 3, H, W]`` uint8 images of client ``client_id``."""
        if not 0 <= client_id < self.num_clients:
            raise ValueError(f"client id {client_id} outside 0..{self.num_clients - 1}")
        return self.train_data().subset(self.partition()[client_id]).to_tensor()

    def client_labels(self, client_id: int) -> torch.Tensor:
        """``[n_k]`` labels of client ``client_id``'s images, in :meth:`client_images`' order (supervised FedAvg only)."""
        if not 0 <= client_id < self.num_clients:
            raise ValueError(f"client id {client_id} outside 0..{self.num_clients - 1}")
        return torch.as_tensor(self.train_data().labels[self.partition()[client_id]], dtype=torch.long)


@lru_cache(maxsize=4)
def _partition(split: FederatedSplit) -> list[np.ndarray]:
    labels = split.train_data().labels
    return dirichlet_partition(labels, num_clients=split.num_clients, alpha=split.alpha, seed=split.seed)
