"""SecAgg+ masks: expanding a secret seed into a uniform integer vector with a cryptographic PRG (docs/privacy.md, "SecAgg+ masks").

Flower 1.41 folds every seed to 32 bits (flwrlabs/flower#7522); here the
whole seed keys an AES-256-CTR stream through HKDF-SHA256. A key is only
ever used for this one stream, so the fixed counter start is safe. Client
and server both call :func:`expand_mask`, after agreeing on :data:`PROTOCOL_VERSION`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: privfed's SecAgg+ protocol: Flower's message flow with masks from :func:`expand_mask`. A node refuses any other.
PROTOCOL_VERSION = "privfed-secagg+/2"
#: The PRG that protocol version expands masks with (recorded in ``summary.json``).
MASK_PRG = "HKDF-SHA256 -> AES-256-CTR"
#: Config key under which the server states, and each client answers with, the protocol version at setup.
PROTOCOL_KEY = "privfed_protocol"

#: Binds the derived key to this use and version: the same seed keys no other stream.
_KEY_INFO = b"privfed secagg+ mask stream v2"
#: Seeds shorter than this cannot hold 128 bits of secret.
_MIN_SEED_BYTES = 16
_BLOCK = 16


def mask_key(seed: bytes) -> bytes:
    """The AES-256 key a seed's mask stream runs under (HKDF-SHA256 of the whole seed)."""
    if len(seed) < _MIN_SEED_BYTES:
        raise ValueError(f"a mask seed needs at least {_MIN_SEED_BYTES} bytes, got {len(seed)}")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KEY_INFO).derive(seed)


def expand_mask(seed: bytes, modulus: int, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """One int64 mask per shape, every entry uniform over ``[0, modulus)`` (at most 2^63), from ``seed`` alone.

    A power-of-two modulus keeps the low bits of keystream words (exactly
    uniform); any other is drawn by rejection from 64-bit words.
    """
    if not isinstance(modulus, int) or not 2 <= modulus <= 2**63:
        raise ValueError(f"the mask modulus must be an integer in [2, 2^63], got {modulus!r}")
    sizes = [math.prod(shape) for shape in shapes]
    stream = Cipher(algorithms.AES(mask_key(seed)), modes.CTR(bytes(_BLOCK))).encryptor()
    values = _uniform(stream, modulus, sum(sizes))
    masks, start = [], 0
    for shape, size in zip(shapes, sizes):
        masks.append(values[start : start + size].reshape(shape))
        start += size
    return masks


def _uniform(stream: CipherContext, modulus: int, count: int) -> np.ndarray:
    """``count`` values uniform over ``[0, modulus)`` from a keystream."""
    if modulus & (modulus - 1) == 0:
        values = _keystream_words(stream, count)
        values &= np.int64(modulus - 1)  # low bits of uniform words: exactly uniform
        return values
    # Reject the top partial range of 64-bit words, so every residue has the same number of preimages.
    limit = np.uint64(2**64 - 2**64 % modulus)
    kept: list[np.ndarray] = []
    missing = count
    while missing > 0:
        words = _keystream_words(stream, missing + missing // 8 + 8).view(np.uint64)
        accepted = words[words < limit][:missing]
        kept.append((accepted % np.uint64(modulus)).astype(np.int64))
        missing -= accepted.size
    return np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)


#: Keystream bytes produced per call: small enough to stay in cache, large enough to amortise the call.
_CHUNK = 1 << 20


def _keystream_words(stream: CipherContext, count: int) -> np.ndarray:
    """The next ``8 * count`` keystream bytes as int64 words, written in place (no copies of the stream)."""
    # ``update_into`` may write up to one block past the data, so the buffer has a block of slack.
    buffer = np.empty(count + _BLOCK // 8, dtype=np.int64)
    out = buffer.data.cast("B")
    zeros = bytes(min(_CHUNK, 8 * count))
    for start in range(0, 8 * count, _CHUNK):
        length = min(_CHUNK, 8 * count - start)
        stream.update_into(zeros[:length], out[start : start + length + _BLOCK - 1])
    return buffer[:count]
