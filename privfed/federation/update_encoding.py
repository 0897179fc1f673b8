"""How a client's model delta is written into SecAgg+'s fixed-point sum, and read back.

SecAgg+ multiplies every value by the client's weight ratio ``n / max_weight``,
clips it to ``±clipping_range`` and quantises it; whatever falls outside the
range is silently saturated. Model deltas do not respect a fixed range: in the
first training rounds BatchNorm ``running_var`` deltas reach 10-20 while
weight deltas stay below 0.5. So each tensor travels divided by a public
scale, and the vector carries two extra indicators per tensor, summed
securely like everything else:

* ``overflow``: this client's scaled tensor left the clipping range;
* ``high``: it used more than half of the range.

The server only learns the (weighted) fraction of clients that raised each
indicator, never which client. It rejects the aggregate of any tensor that
overflowed and grows the scales of tensors that ran high, so the next rounds
fit (see :func:`next_scales`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Fraction of the clipping range above which a tensor's scale is doubled.
HIGH_WATER = 0.5
#: Scale growth after an overflow (the tensor's aggregate was rejected).
OVERFLOW_GROWTH = 4.0
#: Scale growth after a tensor ran high.
HIGH_GROWTH = 2.0


def initial_scales(keys: list[str]) -> np.ndarray:
    """Starting scales: BatchNorm statistics move far more in a round than weights do.

    The first training round moves them most (from their initial 0 and 1 to
    the data's statistics): running variances by up to ~40 on the embedded
    shapes, running means by a few units, weights by well under 1.
    """
    return np.array(
        [16.0 if k.endswith("running_var") else 4.0 if k.endswith("running_mean") else 1.0 for k in keys]
    )


def encode_update(
    delta: list[np.ndarray], scales: np.ndarray, *, weight_ratio: float, clipping_range: float
) -> list[np.ndarray]:
    """The arrays a client hands to SecAgg+: scaled tensors, then the two indicator vectors.

    Args:
        delta: The client's model delta, one array per travelling tensor.
        scales: One public scale per tensor (from the server).
        weight_ratio: ``num_examples / max_weight``, the factor SecAgg+ applies.
        clipping_range: SecAgg+'s clipping range.
    """
    if len(delta) != len(scales):
        raise ValueError(f"{len(delta)} tensors but {len(scales)} scales")
    if not 0 < weight_ratio <= 1:
        raise ValueError(f"weight ratio must be in (0, 1], got {weight_ratio}; max_weight is too small")
    scaled = [np.asarray(d, dtype=np.float64) / s for d, s in zip(delta, scales)]
    peaks = np.array([np.abs(x).max(initial=0.0) * weight_ratio for x in scaled])
    overflow = (peaks > clipping_range).astype(np.float64)
    high = (peaks > HIGH_WATER * clipping_range).astype(np.float64)
    return [*scaled, overflow, high]


@dataclass(frozen=True)
class DecodedAggregate:
    """The FedAvg mean delta recovered from SecAgg+'s output.

    Attributes:
        mean: Weighted-mean delta per tensor (rejected tensors are zero).
        overflow: Per tensor, whether some client's values were clipped; such a
            tensor's mean is wrong and has been zeroed.
        high: Per tensor, whether some client used over half the range.
    """

    mean: list[np.ndarray]
    overflow: np.ndarray
    high: np.ndarray


def decode_aggregate(
    arrays: list[np.ndarray], scales: np.ndarray, *, client_weights: list[float]
) -> DecodedAggregate:
    """Undoes :func:`encode_update` on the securely aggregated weighted mean.

    Args:
        arrays: SecAgg+'s aggregate: weighted means of the encoded arrays.
        scales: The scales the clients used this round.
        client_weights: The ``num_examples`` of the clients in the sum; an
            indicator raised by the lightest of them alone still shows up as
            ``min(weights) / sum(weights)``, so half of that is the detection
            threshold (far above the quantisation error).
    """
    num_tensors = len(scales)
    if len(arrays) != num_tensors + 2:
        raise ValueError(f"expected {num_tensors + 2} aggregated arrays, got {len(arrays)}")
    threshold = 0.5 * min(client_weights) / sum(client_weights)
    overflow = np.asarray(arrays[num_tensors]) > threshold
    high = np.asarray(arrays[num_tensors + 1]) > threshold
    mean = [
        np.zeros_like(a, dtype=np.float32) if bad else (np.asarray(a) * s).astype(np.float32)
        for a, s, bad in zip(arrays[:num_tensors], scales, overflow)
    ]
    return DecodedAggregate(mean=mean, overflow=overflow, high=high)


def next_scales(scales: np.ndarray, decoded: DecodedAggregate) -> np.ndarray:
    """Public scales for the next round: grown wherever this round came close to clipping."""
    growth = np.where(decoded.overflow, OVERFLOW_GROWTH, np.where(decoded.high, HIGH_GROWTH, 1.0))
    return scales * growth
