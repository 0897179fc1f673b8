"""Tests for the Dirichlet client partition and heterogeneity statistics."""

import numpy as np
import pytest

from privfed.data.partition import HeterogeneityStats, dirichlet_partition, heterogeneity_stats
from privfed.errors import PrivfedError


def _labels(n: int = 2000, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.arange(n) % classes)


def test_every_sample_assigned_exactly_once():
    labels = _labels()
    parts = dirichlet_partition(labels, num_clients=30, alpha=0.3, seed=1)
    assert len(parts) == 30
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)  # sorted, no duplicates within a client
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))


def test_reproducible_for_seed_and_different_for_other_seed():
    labels = _labels()
    a = dirichlet_partition(labels, num_clients=20, alpha=0.5, seed=7)
    b = dirichlet_partition(labels, num_clients=20, alpha=0.5, seed=7)
    c = dirichlet_partition(labels, num_clients=20, alpha=0.5, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_min_size_respected_by_redraws():
    parts = dirichlet_partition(_labels(1000), num_clients=40, alpha=0.05, seed=0, min_size=5)
    assert min(len(p) for p in parts) >= 5


def test_min_size_respected_by_fallback():
    # 20 clients × 10 samples = all 200 samples: only an exactly even split
    # works, which Dirichlet draws essentially never give, so samples must move.
    labels = _labels(200)
    parts = dirichlet_partition(labels, num_clients=20, alpha=0.5, seed=0, min_size=10)
    assert [len(p) for p in parts] == [10] * 20
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(200))
    again = dirichlet_partition(labels, num_clients=20, alpha=0.5, seed=0, min_size=10)
    assert all(np.array_equal(x, y) for x, y in zip(parts, again, strict=True))


def test_single_client_gets_everything():
    parts = dirichlet_partition(_labels(50), num_clients=1, alpha=0.1, seed=0)
    np.testing.assert_array_equal(parts[0], np.arange(50))


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_alpha(alpha):
    with pytest.raises(PrivfedError, match="alpha"):
        dirichlet_partition(_labels(), num_clients=5, alpha=alpha, seed=0)


def test_bad_client_counts():
    with pytest.raises(PrivfedError, match="at least 1 client"):
        dirichlet_partition(_labels(), num_clients=0, alpha=1.0, seed=0)
    with pytest.raises(PrivfedError, match="10 samples across 11 clients"):
        dirichlet_partition(_labels(10), num_clients=11, alpha=1.0, seed=0)
    with pytest.raises(PrivfedError, match="each of 5 clients 3 samples"):
        dirichlet_partition(_labels(10), num_clients=5, alpha=1.0, seed=0, min_size=3)


def test_smaller_alpha_gives_fewer_classes_per_client():
    labels = _labels(5000)
    skewed = heterogeneity_stats(
        labels, dirichlet_partition(labels, num_clients=50, alpha=0.1, seed=0)
    )
    mild = heterogeneity_stats(
        labels, dirichlet_partition(labels, num_clients=50, alpha=1.0, seed=0)
    )
    iid = heterogeneity_stats(
        labels, dirichlet_partition(labels, num_clients=50, alpha=1000.0, seed=0)
    )
    assert (
        skewed.mean_classes_above_1pct < mild.mean_classes_above_1pct < iid.mean_classes_above_1pct
    )
    assert skewed.mean_classes_present < mild.mean_classes_present
    assert iid.mean_classes_present == 10.0
    assert skewed.mean_classes_above_1pct < 5.0


def test_heterogeneity_stats_by_hand():
    labels = np.array([0] * 200 + [1] + [2, 2, 3])
    partition = [np.arange(201), np.array([201, 202, 203])]
    stats = heterogeneity_stats(labels, partition)
    # Client 0: classes {0, 1} present, but class 1 is 1/201 < 1 %; client 1: {2, 3}.
    assert stats == HeterogeneityStats(
        mean_classes_present=2.0,
        mean_classes_above_1pct=1.5,
        min_client_size=3,
        max_client_size=201,
        mean_client_size=102.0,
    )
