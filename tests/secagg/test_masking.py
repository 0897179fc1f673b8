"""An aggregated mechanism's share rides in the SecAgg+ vector next to the update, and both come out of one sum."""

from __future__ import annotations

import os

import numpy as np
import pytest

from privfed.secagg.mask_pool import MaskPool
from privfed.secagg.masking import (
    decode_weighted_mean,
    encode_update,
    mask_update,
    split_share,
    unmask_sum,
)

CLIPPING, LEVELS, MODULUS = 8.0, 2**22, 2**32
PAIRWISE = os.urandom(32)


def masked(node_id: int, other: int, update: list[np.ndarray], size: int, share: np.ndarray | None, seed: bytes):
    encoded = encode_update(update, size, max_weight=100.0, clipping_range=CLIPPING, quantization_range=LEVELS, share=share)
    return mask_update(encoded, node_id=node_id, private_seed=seed, pairwise_seeds={other: PAIRWISE}, modulus=MODULUS)


@pytest.mark.parametrize("with_share", [True, False])
def test_the_update_mean_and_the_summed_shares_come_out_of_one_masked_sum(with_share):
    rng = np.random.default_rng(0)
    updates = {1: [rng.uniform(-1, 1, (3, 2)), rng.uniform(-1, 1, 4)], 2: [rng.uniform(-1, 1, (3, 2)), rng.uniform(-1, 1, 4)]}
    sizes = {1: 30, 2: 70}
    shares = {n: rng.integers(0, MODULUS, 50, dtype=np.int64) for n in updates} if with_share else {1: None, 2: None}
    seeds = {n: os.urandom(32) for n in updates}
    vectors = {n: masked(n, 3 - n, updates[n], sizes[n], shares[n], seeds[n]) for n in updates}
    total = [np.mod(a + b, MODULUS) for a, b in zip(vectors[1], vectors[2])]
    unmasked = unmask_sum(total, private_seeds=seeds, dropped_pairwise_seeds={}, modulus=MODULUS)
    update_sum, share_sum = split_share(unmasked, has_share=with_share)
    mean = decode_weighted_mean(update_sum, num_summed=2, clipping_range=CLIPPING, quantization_range=LEVELS)
    for got, a, b in zip(mean, updates[1], updates[2]):
        assert np.abs(got - (0.3 * a + 0.7 * b)).max() < 1e-4
    if with_share:
        assert np.array_equal(share_sum, np.mod(shares[1] + shares[2], MODULUS))
    else:
        assert share_sum is None


def test_a_masked_share_shows_nothing_of_the_share():
    share = np.zeros(4096, dtype=np.int64)
    vector = masked(1, 2, [np.zeros(3)], 10, share, os.urandom(32))[-1]
    assert vector.std() > MODULUS / 4  # uniform-looking, where the share is all zeros


@pytest.mark.parametrize("bad", [np.array([-1, 2]), np.array([[1, 2]]), np.array([0.5, 1.0])])
def test_a_share_that_is_not_a_vector_of_residues_is_refused(bad):
    with pytest.raises(ValueError, match="non-negative integers"):
        encode_update([np.zeros(2)], 10, max_weight=100.0, clipping_range=CLIPPING, quantization_range=LEVELS, share=bad)


@pytest.fixture(scope="module")
def workers():
    pool = MaskPool(2, min_words=0)  # takes every job, however small
    yield pool
    pool.close()


def test_a_client_masks_and_the_server_unmasks_to_the_same_bytes_with_worker_processes_and_without(workers):
    rng = np.random.default_rng(1)
    encoded = encode_update([rng.uniform(-1, 1, (40, 50)), rng.uniform(-1, 1, 7)], 30, max_weight=100.0,
                            clipping_range=CLIPPING, quantization_range=LEVELS, share=rng.integers(0, MODULUS, 9))
    seeds, private = {node: os.urandom(32) for node in (2, 9)}, os.urandom(32)

    def round_trip(pool: MaskPool) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Node 5 masks with neighbours 2 and 9; both drop, and the server takes all of 5's masks off."""
        masked = mask_update(encoded, node_id=5, private_seed=private, pairwise_seeds=seeds, modulus=MODULUS, pool=pool)
        dropped = {2: {5: seeds[2]}, 9: {5: seeds[9]}}
        return masked, unmask_sum(masked, private_seeds={5: private}, dropped_pairwise_seeds=dropped, modulus=MODULUS, pool=pool)

    (alone, unmasked), (pooled, unmasked_pooled) = round_trip(MaskPool(0)), round_trip(workers)
    assert [a.tobytes() for a in alone] == [a.tobytes() for a in pooled] and workers._running
    for got in (unmasked, unmasked_pooled):
        assert all(np.array_equal(a, np.asarray(b, dtype=np.int64)) for a, b in zip(got, encoded, strict=True))
