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

from privfed.secagg.masks import PROTOCOL_VERSION, add_mask_words, expand_mask, mask_key

SHAPES = [(1,), (64,), (3, 5)]


def spec_key(seed: bytes, version: int = 3) -> bytes:
    """HKDF-SHA256 of the whole seed, no salt, info naming the protocol version, 32 bytes."""
    info = f"privfed secagg+ mask stream v{version}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(seed)


def spec_words(seed: bytes, count: int, bits: int = 32) -> np.ndarray:
    """The first ``count`` words of the seed's stream: AES-256-CTR from a zero counter, little-endian."""
    stream = Cipher(algorithms.AES(spec_key(seed)), modes.CTR(bytes(16))).encryptor().update(bytes(bits // 8 * count))
    return np.frombuffer(stream, dtype=f"<u{bits // 8}")


def spec_mask(seed: bytes, size: int, modulus: int = 2**32) -> np.ndarray:
    """The mask ``privfed-secagg+/3`` and ``/4`` specify, written from the spec, not the module.

    Words of 32 bits for a modulus up to 2^32, else of 64. A power-of-two
    modulus keeps each word's low bits; any other skips each word at or
    above the largest multiple of the modulus below 2^bits and reduces the
    rest (plain Python integers, one word at a time).
    """
    bits = 32 if modulus <= 2**32 else 64
    if modulus & (modulus - 1) == 0:
        return (spec_words(seed, size, bits) % np.uint64(modulus)).astype(np.int64)
    limit = 2**bits - 2**bits % modulus
    values: list[int] = []
    words = spec_words(seed, 4 * size + 64, bits)  # far more than the skips of any modulus above need
    for word in map(int, words):
        if word < limit:
            values.append(word % modulus)
        if len(values) == size:
            return np.array(values, dtype=np.int64)
    raise AssertionError("ran out of words")


def flat(masks: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([m.ravel() for m in masks])


def test_the_masks_are_those_the_protocol_version_specifies():
    """A changed PRG (key derivation, cipher, word size) must come with a new protocol version.

    privfed-secagg+/4 changed the messages (signed keys, a consistency stage), not the masks: it expands them
    with the stream of /3, keyed under "v3".
    """
    assert PROTOCOL_VERSION == "privfed-secagg+/4"
    seed = os.urandom(32)
    masks = expand_mask(seed, 2**32, SHAPES)
    assert np.array_equal(flat(masks), spec_mask(seed, sum(m.size for m in masks)))


@pytest.mark.parametrize("modulus", [2**12, 1000, 3 * 2**30, 2**32 - 5, 2**40, 3 * 2**40 + 1])
def test_every_modulus_draws_the_values_the_spec_gives(modulus):
    """Powers of two and rejection, from 32-bit words and (above 2^32) from 64-bit ones."""
    seed = os.urandom(32)
    assert np.array_equal(flat(expand_mask(seed, modulus, [(300,), (2, 50)])), spec_mask(seed, 400, modulus))


def test_no_seed_keys_the_stream_it_keyed_under_the_previous_version():
    seed = os.urandom(32)
    assert mask_key(seed) == spec_key(seed, 3) != spec_key(seed, 2)


@pytest.mark.parametrize("start", [0, 4, 1000, 2**16 - 4, 2**16 + 8])
def test_a_slice_of_added_masks_is_the_signed_sum_of_the_spec_masks_words_over_it(start):
    """Any slice that starts on an AES block can be made on its own (the pool's workers each make one)."""
    seeds, signs, size = [os.urandom(32) for _ in range(3)], [1, -1, -1], 2**16 + 37
    base = np.random.default_rng(0).integers(0, 2**32, size, dtype=np.uint32)
    vector = base.copy()
    add_mask_words(vector, list(zip(seeds, signs)), start=start)
    expected = base.astype(np.int64)
    for seed, sign in zip(seeds, signs):
        expected += sign * spec_words(seed, start + size)[start:].astype(np.int64)
    assert np.array_equal(vector, np.mod(expected, 2**32).astype(np.uint32))


def test_a_slice_must_start_on_an_aes_block():
    with pytest.raises(ValueError, match="AES block"):
        add_mask_words(np.zeros(8, dtype=np.uint32), [(os.urandom(32), 1)], start=2)


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


@pytest.mark.parametrize("modulus", [2**32, 2**12, 1000, 3 * 2**30, 3 * 2**40], ids=["2^32", "2^12", "1000", "3*2^30", "3*2^40"])
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
