"""SecAgg+ masks: expanding a secret seed into a uniform integer vector with a cryptographic PRG (docs/privacy.md, "SecAgg+ masks").

Flower 1.41 folds every seed to 32 bits (flwrlabs/flower#7522); here the
whole seed keys an AES-256-CTR stream through HKDF-SHA256, for this one stream
only, so the fixed counter start is safe. With 32-bit words, entry ``i`` of a
power-of-two mask depends only on word ``i``, so a slice of the mask can be
made on its own (:func:`add_mask_words`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: privfed's SecAgg+ protocol: Flower's message flow with masks from :func:`expand_mask`, signed keys and a
#: consistency check (:mod:`privfed.secagg.client_agreement`). A node refuses any other.
PROTOCOL_VERSION = "privfed-secagg+/4"
#: The PRG that protocol version expands masks with (recorded in ``summary.json``).
MASK_PRG = "HKDF-SHA256 -> AES-256-CTR"
#: Config key under which the server states, and each client answers with, the protocol version at setup.
PROTOCOL_KEY = "privfed_protocol"
#: Largest modulus whose masks come from 32-bit words.
WORD_MODULUS = 2**32
#: A slice of :func:`add_mask_words` starts on an AES block: four 32-bit words.
WORDS_PER_BLOCK = 4

#: Binds the derived key to this use and version: the same seed keys no other stream (v2's info ends in "v2").
_KEY_INFO = b"privfed secagg+ mask stream v3"
#: Seeds shorter than this cannot hold 128 bits of secret.
_MIN_SEED_BYTES = 16
_BLOCK = 16
#: Keystream words made per cipher call: the chunk stays in cache while every mask is added to it.
_CHUNK_WORDS = 1 << 16


def check_seed(seed: bytes) -> None:
    """Refuses a seed too short to hold 128 bits of secret (e.g. one rebuilt from a hostile client's shares)."""
    if len(seed) < _MIN_SEED_BYTES:
        raise ValueError(f"a mask seed needs at least {_MIN_SEED_BYTES} bytes, got {len(seed)}")


def mask_key(seed: bytes) -> bytes:
    """The AES-256 key a seed's mask stream runs under (HKDF-SHA256 of the whole seed)."""
    check_seed(seed)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KEY_INFO).derive(seed)


def _stream(seed: bytes, first_block: int = 0) -> CipherContext:
    """The seed's keystream from AES block ``first_block`` on (the counter is one 128-bit big-endian number)."""
    return Cipher(algorithms.AES(mask_key(seed)), modes.CTR(first_block.to_bytes(_BLOCK, "big"))).encryptor()


def expand_mask(seed: bytes, modulus: int, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """One int64 mask per shape, every entry uniform over ``[0, modulus)`` (at most 2^63), from ``seed`` alone."""
    if not isinstance(modulus, int) or not 2 <= modulus <= 2**63:
        raise ValueError(f"the mask modulus must be an integer in [2, 2^63], got {modulus!r}")
    sizes = [math.prod(shape) for shape in shapes]
    values = _uniform(_stream(seed), modulus, sum(sizes))
    masks, start = [], 0
    for shape, size in zip(shapes, sizes):
        masks.append(values[start : start + size].reshape(shape))
        start += size
    return masks


def add_mask_words(vector: np.ndarray, terms: Sequence[tuple[bytes, int]], *, start: int = 0) -> None:
    """Adds to ``vector`` (uint32, flat), mod 2^32, each seed's 32-bit words ``start`` to ``start + len(vector)``,
    times its sign (+1 or -1).

    For a power-of-two modulus up to 2^32 this is the signed sum of
    :func:`expand_mask`'s masks over that slice, before the final reduction.
    """
    if vector.dtype != np.uint32 or vector.ndim != 1:
        raise ValueError(f"masks are added into a flat uint32 vector, got {vector.dtype} {vector.shape}")
    if start % WORDS_PER_BLOCK:
        raise ValueError(f"a slice of the mask starts on an AES block ({WORDS_PER_BLOCK} words), not at word {start}")
    streams = [(_stream(seed, start // WORDS_PER_BLOCK), sign) for seed, sign in terms]
    words = np.empty(_CHUNK_WORDS + _BLOCK // 4, dtype="<u4")  # a block of slack for update_into
    out, zeros = words.data.cast("B"), bytes(4 * _CHUNK_WORDS)
    for low in range(0, vector.size, _CHUNK_WORDS):
        part = vector[low : low + _CHUNK_WORDS]
        length = 4 * part.size
        for stream, sign in streams:
            stream.update_into(zeros[:length], out[: length + _BLOCK - 1])
            if sign > 0:
                part += words[: part.size]
            else:
                part -= words[: part.size]


def _uniform(stream: CipherContext, modulus: int, count: int) -> np.ndarray:
    """``count`` int64 values uniform over ``[0, modulus)`` from a keystream."""
    dtype = np.dtype("<u4") if modulus <= WORD_MODULUS else np.dtype("<u8")
    if modulus & (modulus - 1) == 0:
        values = _keystream_words(stream, count, dtype)
        values &= dtype.type(modulus - 1)  # low bits of uniform words: exactly uniform
        return values.astype(np.int64)
    # Skip the top partial range of words, so every residue has the same number of preimages.
    span = 2 ** (8 * dtype.itemsize)
    limit = dtype.type(span - span % modulus)
    kept: list[np.ndarray] = []
    missing = count
    while missing > 0:
        words = _keystream_words(stream, missing + missing // 4 + 8, dtype)
        accepted = words[words < limit][:missing]
        kept.append((accepted % dtype.type(modulus)).astype(np.int64))
        missing -= accepted.size
    return np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)


#: Keystream bytes produced per call: small enough to stay in cache, large enough to amortise the call.
_CHUNK = 1 << 20


def _keystream_words(stream: CipherContext, count: int, dtype: np.dtype) -> np.ndarray:
    """The next ``count`` keystream words of ``dtype``, written in place (no copies of the stream)."""
    # ``update_into`` may write up to one block past the data, so the buffer has a block of slack.
    nbytes = count * dtype.itemsize
    buffer = np.empty(nbytes + _BLOCK, dtype=np.uint8)
    out = buffer.data
    zeros = bytes(min(_CHUNK, nbytes))
    for begin in range(0, nbytes, _CHUNK):
        length = min(_CHUNK, nbytes - begin)
        stream.update_into(zeros[:length], out[begin : begin + length + _BLOCK - 1])
    return buffer[:nbytes].view(dtype)
