"""A client's SecAgg+ side before its mod masks the update: it checks the server's encoding, then encodes with it.

:class:`privfed.federation.client.OrchestraClient` calls both in a training
round; the masking itself is :mod:`privfed.secagg.client_mod`'s.
"""

from __future__ import annotations

import numpy as np
from flwr.common import bytes_to_ndarray

from privfed.privacy.client_guard import RoundRefused
from privfed.records import record_item
from privfed.secagg.encoding import encode_update, initial_scales, secagg_weight_ratio
from privfed.secagg.settings import SecAggPlusSettings


def check_secagg_encoding(fit: dict, declared: SecAggPlusSettings, keys: list[str]) -> np.ndarray:
    """The round's public SecAgg+ scales; refuses a training round without SecAgg+ or with other encodings than declared.

    Another encoding would make a raised indicator count other than 1 and
    name the client. The scales must be finite and no smaller than the
    initial ones (the strategy only grows them): a tiny scale would turn a
    finite update into Inf, and the failed round would tell the server that
    the update passed a threshold the server chose. A refusal names the setting.
    """
    if "secagg_scales" not in fit:
        raise RoundRefused("the run declared SecAgg+; the server asked for an update without it")
    own = declared.encoding_config()
    sent = {key: fit.get(key) for key in own}
    if any(value is None or float(value) != float(own[key]) for key, value in sent.items()):
        raise RoundRefused(f"the server's SecAgg+ encoding {sent} differs from the declared run's {own}")
    scales = bytes_to_ndarray(record_item(fit["secagg_scales"], bytes))
    smallest = initial_scales(keys)
    if scales.shape != smallest.shape or not (np.isfinite(scales).all() and (scales >= smallest).all()):
        raise RoundRefused("the server's SecAgg+ scales are not finite, or below the initial scales, or of another shape")
    return scales


def prepare_for_secagg(arrays: list[np.ndarray], scales: np.ndarray, settings: SecAggPlusSettings, num_samples: int) -> list[np.ndarray]:
    """The update rescaled and encoded for SecAgg+ with the declared encoding and this round's public scales."""
    if num_samples > settings.max_weight:
        raise ValueError(
            f"this client holds {num_samples} samples but SecAgg+'s max_weight is {settings.max_weight:g}; "
            "client and server disagree on the data partition"
        )
    quantization_range = settings.quantization_range
    weight_ratio = secagg_weight_ratio(num_samples, max_weight=settings.max_weight, quantization_range=quantization_range)
    return encode_update(
        arrays, scales, weight_ratio=weight_ratio, clipping_range=settings.clipping_range, quantization_range=quantization_range,
    )
