"""The server sums masked vectors as they arrive: a round's memory grows with the update's size, not with clients.

Measured with tracemalloc over a whole in-process round (numpy reports its
buffers to it). The harness's grid answers one pull with one reply and
keeps no masked vector, so what the clients' side holds at once is one
client's masking; holding every reply, as Flower's stage does, would need
each client's vector at once.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity

from benchmarks.secagg_harness import mean_of, run_round
from privfed.secagg.settings import default_num_shares, default_threshold
from privfed.secagg.workflow import MaskedSum
from tests.secagg.flower_prg import replace_flowers_prg

# Every client shares keys with all others, so a round's Shamir sharing grows as CLIENTS^3: 40 clients took 400 s
# under tracemalloc. Measured at 20: 10.5 vectors; 25.6 with every masked reply held until the last arrived.
CLIENTS, VALUES = 20, 50_000
VECTOR_BYTES = (VALUES + 1) * 8  # one masked vector: the int64 update and its weight


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)


@pytest.fixture(autouse=True)
def no_flower_prg(monkeypatch):
    replace_flowers_prg(monkeypatch)


def test_a_round_of_many_clients_holds_a_few_masked_vectors_at_once_not_one_per_client():
    rng = np.random.default_rng(0)
    updates = {100 + i: ([rng.uniform(-0.1, 0.1, VALUES).astype(np.float32)], 10 + i) for i in range(CLIENTS)}
    shares = default_num_shares(CLIENTS)
    tracemalloc.start()
    try:
        outcome = run_round(updates, shares=shares, threshold=default_threshold(shares), record_masked=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.completed and outcome.strategy.aggregated_from == sorted(updates)
    assert np.abs(outcome.mean - mean_of(updates, sorted(updates))).max() < 1e-3  # the fixed point's error: ~1e-5
    assert peak < 0.75 * CLIENTS * VECTOR_BYTES, f"peak {peak / VECTOR_BYTES:.1f} masked vectors for {CLIENTS} clients"


def test_the_running_sum_is_the_sum_mod_m_and_refuses_a_vector_of_another_form():
    rng = np.random.default_rng(1)
    vectors = [[rng.integers(0, 2**32, (4, 3)), rng.integers(0, 2**32, 5)] for _ in range(7)]
    running = MaskedSum(2**32)
    for vector in vectors:
        running.add(vector)
    total = running.total()
    assert total is not None and running.count == 7
    for got, arrays in zip(total, zip(*vectors)):
        np.testing.assert_array_equal(got, sum(a.astype(object) for a in arrays) % 2**32)
    for bad in ([np.zeros((4, 3), np.int64)], [np.zeros((3, 4), np.int64), np.zeros(5, np.int64)],
                [np.zeros((4, 3)), np.zeros(5)], None):
        other = MaskedSum(2**32)
        other.add(vectors[0])
        with pytest.raises((ValueError, TypeError)):  # numpy would broadcast or cast them silently
            other.add(bad)
