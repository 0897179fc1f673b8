"""privfed's SecAgg+ mask PRG: it is the PRG its protocol version names, the whole seed matters, the masks are uniform."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
from scipy.stats import chisquare

from privfed.secagg.masks import PROTOCOL_VERSION, expand_mask

SHAPES = [(1,), (64,), (3, 5)]


def spec_mask(seed: bytes, size: int, modulus: int = 2**32) -> np.ndarray:
    """The mask ``privfed-secagg+/2`` specifies, for a power-of-two modulus, written from the spec, not the module.

    Key: HKDF-SHA256 of the whole seed (no salt, info "privfed secagg+ mask stream v2"), 32 bytes. Stream:
    AES-256-CTR from a zero counter, read as little-endian 64-bit words; each value keeps a word's low bits.
    """
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"privfed secagg+ mask stream v2").derive(seed)
    stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(8 * size))
    return (np.frombuffer(stream, dtype="<u8") % np.uint64(modulus)).astype(np.int64)


def test_the_masks_are_those_the_protocol_version_specifies():
    """A changed PRG (key derivation, cipher, word size) must come with a new protocol version."""
    assert PROTOCOL_VERSION == "privfed-secagg+/2"
    seed = os.urandom(32)
    masks = expand_mask(seed, 2**32, SHAPES)
    assert np.array_equal(np.concatenate([m.ravel() for m in masks]), spec_mask(seed, sum(m.size for m in masks)))


def xor_fold(seed: bytes) -> int:
    """What Flower keeps of a seed: the XOR of its 32-bit words."""
    folded = 0
    for start in range(0, len(seed), 4):
        folded ^= int.from_bytes(seed[start : start + 4], "little")
    return folded


def same(masks: list[np.ndarray], others: list[np.ndarray]) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(masks, others, strict=True))


def test_seeds_with_equal_xor_folds_give_flower_one_mask_and_privfed_two():
    seed = bytes(range(32))
    swapped = seed[4:8] + seed[:4] + seed[8:]  # same words, another order: the same fold
    assert seed != swapped and xor_fold(seed) == xor_fold(swapped)
    assert same(pseudo_rand_gen(seed, 2**32, SHAPES), pseudo_rand_gen(swapped, 2**32, SHAPES))
    assert not same(expand_mask(seed, 2**32, SHAPES), expand_mask(swapped, 2**32, SHAPES))


def test_every_flipped_seed_bit_changes_about_half_of_the_mask_bits():
    seed = os.urandom(32)
    mask = expand_mask(seed, 2**32, [(256,)])[0]
    for bit in range(8 * len(seed)):
        flipped = bytearray(seed)
        flipped[bit // 8] ^= 1 << (bit % 8)
        other = expand_mask(bytes(flipped), 2**32, [(256,)])[0]
        changed = np.unpackbits((mask ^ other).astype("<u4").view(np.uint8)).mean()
        assert 0.4 < changed < 0.6, f"bit {bit}: {changed:.3f} of the mask bits changed"


def test_the_same_seed_gives_the_same_masks_in_the_requested_shapes():
    seed = os.urandom(44)  # a pairwise key: Flower's base64 of 32 bytes
    masks = expand_mask(seed, 2**32, SHAPES)
    assert [m.shape for m in masks] == SHAPES and all(m.dtype == np.int64 for m in masks)
    assert same(masks, expand_mask(seed, 2**32, SHAPES))


def chi_square_p(values: np.ndarray, bins: int) -> float:
    return float(chisquare(np.bincount(values, minlength=bins)).pvalue)


@pytest.mark.parametrize("modulus", [2**32, 2**12, 1000, 3 * 2**30], ids=["2^32", "2^12", "1000", "3*2^30"])
def test_mask_values_are_uniform_over_the_modulus(modulus):
    values = expand_mask(os.urandom(32), modulus, [(2**20,)])[0]
    assert values.min() >= 0 and values.max() < modulus
    bins = min(modulus, 1024)
    # Equal-width bins over [0, modulus): exact for these moduli, which all divide into 1024 bins or fewer evenly.
    assert modulus % bins == 0
    assert chi_square_p(values // (modulus // bins), bins) > 1e-4


def test_every_value_of_a_small_modulus_is_drawn_equally_often():
    """Exact counts, so a value that can never be drawn (e.g. the top one) cannot hide in a bin."""
    counts = np.bincount(expand_mask(os.urandom(32), 16, [(2**16,)])[0], minlength=16)
    assert counts.size == 16 and chisquare(counts).pvalue > 1e-4


def test_the_uniformity_check_sees_modulo_bias():
    """The reduction a naive PRG would use (32-bit word mod 3*2^30) fails the same check: the test has power."""
    modulus, bins = 3 * 2**30, 1024
    words = np.random.default_rng(0).integers(0, 2**32, 2**20, dtype=np.int64)
    assert chi_square_p((words % modulus) // (modulus // bins), bins) < 1e-12


@pytest.mark.parametrize(("seed", "modulus"), [(b"short", 2**32), (bytes(32), 1), (bytes(32), 2**64), (bytes(32), 2.0**32)])
def test_weak_seeds_and_impossible_moduli_are_refused(seed, modulus):
    with pytest.raises(ValueError):
        expand_mask(seed, modulus, SHAPES)
