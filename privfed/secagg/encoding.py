"""How a client's model delta is written into SecAgg+'s fixed-point sum, and read back.

Each tensor travels divided by a public scale, with two indicators per
tensor (``overflow``: it left the clipping range; ``high``: it used over
half of it), each divided by the client's own weight ratio so that the sum
counts the clients that raised it, not which (docs/architecture.md,
"Secure aggregation"; across rounds, docs/privacy.md, "SecAgg+ side
channels"). An overflow drops the round's update and grows the scales
(:func:`next_scales`, up to :func:`max_useful_scale`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privfed.secagg.settings import indicators_are_exact

#: Fraction of the clipping range above which a tensor's scale is doubled.
HIGH_WATER = 0.5
#: Scale growth after an overflow (the tensor's aggregate was rejected).
OVERFLOW_GROWTH = 4.0
#: Scale growth after a tensor ran high.
HIGH_GROWTH = 2.0


def initial_scales(keys: list[str]) -> np.ndarray:
    """Starting scales: in the first round BatchNorm's running variances move by up to ~40, weights by well under 1."""
    return np.array(
        [16.0 if k.endswith("running_var") else 4.0 if k.endswith("running_mean") else 1.0 for k in keys]
    )


def secagg_weight_ratio(num_examples: float, *, max_weight: float, quantization_range: int) -> float:
    """The factor SecAgg+ multiplies a client's values by: ``num_examples / max_weight``, rounded as Flower rounds it
    (an indicator divided by it adds exactly 1)."""
    if not 0 < num_examples <= max_weight:
        raise ValueError(f"a client of {num_examples:g} samples is outside SecAgg+'s max_weight {max_weight:g}")
    ratio = round(num_examples / max_weight * quantization_range) / quantization_range
    if ratio == 0:
        raise ValueError(f"max_weight {max_weight:g} is too large for SecAgg+'s quantisation range {quantization_range}")
    return ratio


def encode_update(
    delta: list[np.ndarray],
    scales: np.ndarray,
    *,
    weight_ratio: float,
    clipping_range: float,
    quantization_range: int | None = None,
) -> list[np.ndarray]:
    """The arrays a client hands to SecAgg+: each tensor divided by its public scale, then the two indicator vectors.

    A clipping range below 1 would clip a raised indicator away; with a
    ``quantization_range`` it must also put the indicators on the grid
    (:func:`privfed.secagg.settings.indicators_are_exact`).

    Raises:
        ValueError: for a delta that is not finite (SecAgg+ would quantise a
            NaN to garbage no indicator flags), or a range that cannot carry the indicators.
    """
    if len(delta) != len(scales):
        raise ValueError(f"{len(delta)} tensors but {len(scales)} scales")
    if not 0 < weight_ratio <= 1:
        raise ValueError(f"weight ratio must be in (0, 1], got {weight_ratio}; max_weight is too small")
    if clipping_range < 1:
        raise ValueError(f"SecAgg+'s clipping range must be at least 1 to carry the indicators, got {clipping_range}")
    if quantization_range is not None and not indicators_are_exact(clipping_range, quantization_range):
        raise ValueError(
            f"SecAgg+'s clipping range {clipping_range:g} puts the overflow indicators off its fixed-point grid, "
            "where their rounding would tell the server which clients raised them; use a power of two"
        )
    scaled = [np.asarray(d, dtype=np.float64) / s for d, s in zip(delta, scales)]
    if not all(np.isfinite(x).all() for x in scaled):
        raise ValueError("the model delta holds NaN or Inf")
    peaks = np.array([np.abs(x).max(initial=0.0) * weight_ratio for x in scaled])
    overflow = (peaks > clipping_range) / weight_ratio
    high = (peaks > HIGH_WATER * clipping_range) / weight_ratio
    return [*scaled, overflow, high]


def secure_sum_shapes(tensor_shapes: list[tuple[int, ...]], *, metrics: bool) -> list[tuple[int, ...]]:
    """The shapes of the arrays a client hands to SecAgg+: :func:`encode_update`'s, then, when the run reports
    client metrics (``--report-client-metrics``), :func:`encode_metrics`'."""
    indicators = (len(tensor_shapes),)
    return [*tensor_shapes, indicators, indicators, *([(2 * len(SECURE_METRIC_SCALES),)] if metrics else [])]


@dataclass(frozen=True)
class DecodedAggregate:
    """The FedAvg mean delta recovered from SecAgg+'s output.

    Attributes:
        mean: Weighted-mean delta per tensor; zero where any client's values were clipped (``overflow_counts``).
        overflow_counts: Per tensor, how many clients' values were clipped.
        high_counts: Per tensor, how many clients used over half the range.
    """

    mean: list[np.ndarray]
    overflow_counts: np.ndarray
    high_counts: np.ndarray

    @property
    def overflow(self) -> np.ndarray:
        return self.overflow_counts > 0

    @property
    def high(self) -> np.ndarray:
        return self.high_counts > 0


class ImplausibleAggregate(ValueError):
    """A secure aggregate no honest round can produce (e.g. a client tampered with its masked weight factor)."""


def check_plausible(means: list[np.ndarray], *, clipping_range: float) -> None:
    """Raises :class:`ImplausibleAggregate` unless every value is finite and within the clipping range.

    A mean of values clipped to ``[-c, c]`` stays there, but a client can
    change the masked weight factor Flower divides by: to 0 (infinities) or
    to a tiny value (huge values).
    """
    bound = clipping_range * (1 + 1e-3) + 1e-6
    for index, mean in enumerate(means):
        values = np.asarray(mean, dtype=np.float64)
        if values.size and (not np.isfinite(values).all() or float(np.abs(values).max()) > bound):
            raise ImplausibleAggregate(f"aggregated tensor {index} is not finite or outside the clipping range {clipping_range:g}")


def decode_aggregate(
    arrays: list[np.ndarray], scales: np.ndarray, *, weight_ratios: list[float], clipping_range: float | None = None
) -> DecodedAggregate:
    """Undoes :func:`encode_update` on SecAgg+'s weighted mean of the encoded arrays.

    The clients' public ``weight_ratios`` turn the indicators' mean back into
    counts; with a ``clipping_range``, :func:`check_plausible` checks the mean.
    """
    num_tensors = len(scales)
    if len(arrays) != num_tensors + 2:
        raise ValueError(f"expected {num_tensors + 2} aggregated arrays, got {len(arrays)}")
    if clipping_range is not None:
        check_plausible(arrays[:num_tensors], clipping_range=clipping_range)
    total = sum(weight_ratios)
    overflow_counts = np.rint(np.asarray(arrays[num_tensors]) * total).astype(np.int64)
    high_counts = np.rint(np.asarray(arrays[num_tensors + 1]) * total).astype(np.int64)
    mean = [
        np.zeros_like(a, dtype=np.float32) if bad else (np.asarray(a) * s).astype(np.float32)
        for a, s, bad in zip(arrays[:num_tensors], scales, overflow_counts > 0)
    ]
    return DecodedAggregate(mean=mean, overflow_counts=overflow_counts, high_counts=high_counts)


def max_useful_scale(quantization_range: int) -> float:
    """The largest scale worth growing to, ``Q / 2``: beyond, the grid step ``scale * 2c / Q`` exceeds the range c."""
    return quantization_range / 2


def next_scales(scales: np.ndarray, decoded: DecodedAggregate, *, max_scale: float) -> np.ndarray:
    """Public scales for the next round: grown wherever this round came close to clipping, never past ``max_scale``
    (:func:`max_useful_scale`), nor below where they were."""
    growth = np.where(decoded.overflow, OVERFLOW_GROWTH, np.where(decoded.high, HIGH_GROWTH, 1.0))
    return np.maximum(scales, np.minimum(scales * growth, max_scale))


#: Training metrics that travel inside the secure sum (``--report-client-metrics``), each divided by a public
#: scale so that typical values fit the clipping range.
SECURE_METRIC_SCALES: dict[str, float] = {
    "loss": 16.0,
    "cluster_loss": 16.0,
    "rotation_loss": 4.0,
    "target_entropy": 1.0,
    "centroid_cosine": 1.0,
    "steps": 1024.0,
    "train_seconds": 1024.0,
    "release_seconds": 64.0,
}


def encode_metrics(metrics: dict[str, float], *, clipping_range: float) -> np.ndarray:
    """A client's training metrics as one more array of the secure sum: ``[value / scale, present]`` per metric.

    The server sees the round's weighted means; over rounds whose cohorts
    change, these let it solve for each client's own values up to one common
    offset (``tests/secagg/test_encoding.py``). ``present`` lets a metric some
    clients do not report average over those that do (whether a client
    reports one follows from its public size and the run's method). Values
    beyond the clipping range are clipped.
    """
    pairs = []
    for name, scale in SECURE_METRIC_SCALES.items():
        value = metrics.get(name)
        if value is None or not math.isfinite(value):
            pairs += [0.0, 0.0]
        else:
            pairs += [float(np.clip(value / scale, -clipping_range, clipping_range)), 1.0]
    return np.asarray(pairs, dtype=np.float64)


def decode_metrics(aggregate: np.ndarray) -> dict[str, float]:
    """The round's weighted mean of every metric some client reported, from SecAgg+'s aggregate of :func:`encode_metrics`."""
    aggregate = np.asarray(aggregate, dtype=np.float64)
    if aggregate.shape != (2 * len(SECURE_METRIC_SCALES),):
        raise ValueError(f"expected {2 * len(SECURE_METRIC_SCALES)} aggregated metric values, got {aggregate.shape}")
    means = {}
    for index, (name, scale) in enumerate(SECURE_METRIC_SCALES.items()):
        weighted, present = aggregate[2 * index], aggregate[2 * index + 1]
        if present > 1e-3:  # far above the fixed point's error, far below one client's share
            means[name] = float(weighted / present * scale)
    return means
