"""Non-IID client partitions (Dirichlet label skew, as Orchestra's experiments; α = 0.1 the paper's cross-device
default) and how skewed they are; seeded, so mechanisms and attacks are compared on the same clients."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privfed.errors import PrivfedError

#: Full Dirichlet redraws tried before falling back to moving samples.
MAX_ATTEMPTS = 100


def dirichlet_partition(
    labels: np.ndarray,
    *,
    num_clients: int,
    alpha: float,
    seed: int,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Split sample indices across clients with Dirichlet(α) label proportions (smaller α: more skew).

    Each class's shuffled samples are cut by proportions drawn from Dirichlet(α), redrawn (up to
    :data:`MAX_ATTEMPTS` times) until every client holds ``min_size`` samples; failing that, samples move from the
    largest clients, deterministically.

    Returns:
        ``num_clients`` sorted int64 index arrays, every sample in exactly one; the same ``seed``, the same split.

    Raises:
        PrivfedError: For α ≤ 0, K < 1, or more clients than samples allow.
    """
    labels = _check_labels(labels)
    _check_partition_args(len(labels), num_clients, alpha, min_size)
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    clients = _draw(by_class, num_clients, alpha, rng)
    for _ in range(MAX_ATTEMPTS - 1):
        if min(len(c) for c in clients) >= min_size:
            break
        clients = _draw(by_class, num_clients, alpha, rng)
    clients = _top_up(clients, min_size)
    return [np.sort(c).astype(np.int64) for c in clients]


@dataclass(frozen=True)
class HeterogeneityStats:
    """How non-IID a partition is, for logs and run reports (``above_1pct``: classes making up at least 1 % of a client's samples)."""

    mean_classes_present: float
    mean_classes_above_1pct: float
    min_client_size: int
    max_client_size: int
    mean_client_size: float


def heterogeneity_stats(labels: np.ndarray, partition: list[np.ndarray]) -> HeterogeneityStats:
    """Label skew and size spread of a partition."""
    labels = _check_labels(labels)
    if not partition:
        raise PrivfedError("partition has no clients")
    num_classes = int(labels.max()) + 1
    present, above = [], []
    for idx in partition:
        counts = np.bincount(labels[np.asarray(idx, dtype=np.int64)], minlength=num_classes)
        present.append(int((counts >= 1).sum()))
        above.append(int(((counts >= 1) & (counts >= 0.01 * counts.sum())).sum()))
    sizes = np.array([len(idx) for idx in partition])
    return HeterogeneityStats(
        mean_classes_present=float(np.mean(present)),
        mean_classes_above_1pct=float(np.mean(above)),
        min_client_size=int(sizes.min()),
        max_client_size=int(sizes.max()),
        mean_client_size=float(sizes.mean()),
    )


def _check_labels(labels: np.ndarray) -> np.ndarray:
    """Labels as a checked 1-D int64 array of non-negative classes."""
    arr = np.asarray(labels)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise PrivfedError(f"labels must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    if arr.size == 0:
        raise PrivfedError("cannot partition an empty dataset")
    if (arr < 0).any():
        raise PrivfedError("labels must be non-negative class indices")
    return arr.astype(np.int64)


def _check_partition_args(num_samples: int, num_clients: int, alpha: float, min_size: int) -> None:
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise PrivfedError(f"Dirichlet alpha must be a positive number, got {alpha}")
    if num_clients < 1:
        raise PrivfedError(f"need at least 1 client, got {num_clients}")
    if min_size < 0:
        raise PrivfedError(f"min_size must be non-negative, got {min_size}")
    if num_clients > num_samples:
        raise PrivfedError(f"cannot split {num_samples} samples across {num_clients} clients")
    if num_clients * min_size > num_samples:
        raise PrivfedError(
            f"cannot give each of {num_clients} clients {min_size} samples: "
            f"the dataset has only {num_samples}"
        )


def _draw(
    by_class: list[np.ndarray], num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """One Dirichlet draw: split every class's shuffled samples by fresh proportions."""
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for idx in by_class:
        shuffled = rng.permutation(idx)
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(proportions)[:-1] * len(idx)).astype(np.int64)
        for client, piece in enumerate(np.split(shuffled, cuts)):
            parts[client].append(piece)
    return [np.concatenate(p) for p in parts]


def _top_up(clients: list[np.ndarray], min_size: int) -> list[np.ndarray]:
    """Move samples from the largest clients until every client has ``min_size``.

    The donor is the largest client (lowest index on ties) and gives its highest sample index; one above
    ``min_size`` exists while any client is below it, since K·min_size ≤ N.
    """
    clients = [np.sort(c) for c in clients]
    sizes = np.array([len(c) for c in clients])
    for needy in np.flatnonzero(sizes < min_size):
        moved = []
        while sizes[needy] < min_size:
            donor = int(np.argmax(sizes))
            moved.append(clients[donor][-1])
            clients[donor] = clients[donor][:-1]
            sizes[donor] -= 1
            sizes[needy] += 1
        clients[needy] = np.concatenate([clients[needy], np.array(moved, dtype=np.int64)])
    return clients
