"""Both ends of SecAgg+'s masking arithmetic: what a client adds to its update, what the server takes off the sum.

A client adds to its quantised, weighted update its private mask and, per
neighbour, a pairwise mask: added when its node id is the larger, subtracted
otherwise, so the pair cancels in the sum. The server removes each
survivor's private mask and the pairwise masks each client that dropped
after sharing its keys left in its neighbours' vectors. Every mask comes
from :mod:`privfed.secagg.masks`, added by :mod:`privfed.secagg.mask_pool`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.common.secure_aggregation.ndarrays_arithmetic import factor_extract
from flwr.common.secure_aggregation.quantization import dequantize
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

from privfed.secagg.encoding import secagg_weight_ratio
from privfed.secagg.mask_pool import MaskPool, shared_pool
from privfed.secagg.quantization import quantize

#: The fit reply's metrics key under which a secure-sum mechanism's share goes from the client to its SecAgg+ mod,
#: which moves it into the masked vector (:func:`encode_update`); it is never sent in plaintext.
SHARE_KEY = "secure_sum_share"

#: Largest modulus the sums are exact for: a power of two up to it divides 2^32, where uint32 words wrap; any other
#: runs in int64, where a sum of up to 2^31 masks or vectors below it stays below 2^63.
MAX_MODULUS = 2**32


def pairwise_seed(own_private_key: bytes, other_public_key: bytes) -> bytes:
    """The seed two clients share for their pairwise mask (ECDH of one's first key pair with the other's)."""
    return generate_shared_key(bytes_to_private_key(own_private_key), bytes_to_public_key(other_public_key))


def encode_update(
    arrays: list[np.ndarray],
    num_examples: int,
    *,
    max_weight: float,
    clipping_range: float,
    quantization_range: int,
    share: np.ndarray | None = None,
) -> list[np.ndarray]:
    """The update as SecAgg+ sums it: weighted by ``num_examples / max_weight`` on Flower's fixed-point grid.

    The weight (:func:`~privfed.secagg.encoding.secagg_weight_ratio`) travels
    in front as an integer, so the server can divide the sum by the total. A
    secure-sum mechanism's ``share`` (integers already reduced mod the
    modulus) rides at the end unweighted and unquantised, masked like the
    rest (:func:`split_share` takes it off the sum).
    """
    ratio = secagg_weight_ratio(num_examples, max_weight=max_weight, quantization_range=quantization_range)
    levels = quantize(arrays, scale=ratio, clipping_range=clipping_range, quantization_range=quantization_range)
    encoded = [np.array([round(ratio * quantization_range)]), *levels]  # the weight factor in front, as Flower's
    if share is None:
        return encoded
    share = np.asarray(share)
    if share.ndim != 1 or not np.issubdtype(share.dtype, np.integer) or (share.size and share.min() < 0):
        raise ValueError(f"a share is a vector of non-negative integers, got {share.dtype} {share.shape}")
    return [*encoded, share.astype(np.int64)]


def split_share(total: list[np.ndarray], *, has_share: bool) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The unmasked sum's update part, and the summed shares (mod the modulus) when the round carried them."""
    if not has_share:
        return total, None
    if len(total) < 2:
        raise ValueError("a sum that carries shares has the update's arrays and the shares' vector")
    return total[:-1], total[-1]


def mask_update(
    encoded: list[np.ndarray],
    *,
    node_id: int,
    private_seed: bytes,
    pairwise_seeds: Mapping[int, bytes],
    modulus: int,
    pool: MaskPool | None = None,
) -> list[np.ndarray]:
    """``encoded`` plus the client's private mask and its pairwise masks, mod ``modulus``, whatever the ``pool``."""
    _check_modulus(modulus)
    terms = [(private_seed, 1)]
    terms += [(seed, 1 if node_id > neighbour else -1) for neighbour, seed in pairwise_seeds.items()]
    return (pool or shared_pool()).add_masks(encoded, terms, modulus)


def unmask_sum(
    masked_sum: list[np.ndarray],
    *,
    private_seeds: Mapping[int, bytes],
    dropped_pairwise_seeds: Mapping[int, Mapping[int, bytes]],
    modulus: int,
    pool: MaskPool | None = None,
) -> list[np.ndarray]:
    """The sum of the survivors' encoded updates, from the sum of their masked vectors (mod ``modulus``).

    ``private_seeds`` holds each survivor's private mask seed, and
    ``dropped_pairwise_seeds`` the seed each client that dropped after sharing
    its keys shared with each surviving neighbour (all rebuilt from shares).
    """
    _check_modulus(modulus)
    terms = [(seed, -1) for seed in private_seeds.values()]
    for dropped, seeds in dropped_pairwise_seeds.items():
        # The survivor added this mask if its id was the larger one: take off what it put on.
        terms += [(seed, -1 if survivor > dropped else 1) for survivor, seed in seeds.items()]
    return (pool or shared_pool()).add_masks(masked_sum, terms, modulus)


def decode_weighted_mean(
    total: list[np.ndarray], *, num_summed: int, clipping_range: float, quantization_range: int
) -> list[np.ndarray]:
    """The weighted mean of ``num_summed`` clients' updates from the sum of their encodings, each shifted by
    ``+clipping_range`` (:func:`dequantize` takes one shift off, the others go here)."""
    weight, values = factor_extract(total)
    if int(weight) <= 0:
        raise ValueError(f"the summed SecAgg+ weight is {int(weight)}, not positive")
    scale = quantization_range / int(weight)
    mean = dequantize(values, clipping_range, quantization_range)
    return [(array - (num_summed - 1) * clipping_range) * scale for array in mean]


def _check_modulus(modulus: int) -> None:
    if not 2 <= modulus <= MAX_MODULUS:
        raise ValueError(f"a SecAgg+ modulus must be in [2, 2^32] for exact int64 sums, got {modulus}")
