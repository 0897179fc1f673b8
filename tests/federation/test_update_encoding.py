import numpy as np
import pytest

from privfed.federation.update_encoding import (
    HIGH_GROWTH,
    OVERFLOW_GROWTH,
    decode_aggregate,
    encode_update,
    initial_scales,
    next_scales,
)


def secagg_clip(arrays: list[np.ndarray], ratio: float, clipping_range: float) -> list[np.ndarray]:
    """What SecAgg+ does to a client's values before quantising them."""
    return [np.clip(a * ratio, -clipping_range, clipping_range) for a in arrays]


def test_batchnorm_statistics_start_with_larger_scales():
    scales = initial_scales(["a.weight", "a.running_mean", "a.running_var"])
    assert scales[0] == 1.0 and scales[1] > 1.0 and scales[2] > 1.0


def test_a_running_var_delta_of_20_would_be_clipped_unscaled_and_is_flagged():
    delta = [np.array([0.1, -0.2]), np.array([20.0, 1.0])]
    encoded = encode_update(delta, np.ones(2), weight_ratio=1.0, clipping_range=8.0)
    assert encoded[2].tolist() == [0.0, 1.0]  # overflow indicator of the second tensor
    assert encoded[3].tolist() == [0.0, 1.0]
    clipped = secagg_clip(encoded, 1.0, 8.0)
    assert clipped[1][0] == 8.0  # what a silent saturation would have delivered


def test_the_weight_ratio_counts_towards_the_range():
    delta = [np.array([12.0])]
    light = encode_update(delta, np.ones(1), weight_ratio=0.5, clipping_range=8.0)
    heavy = encode_update(delta, np.ones(1), weight_ratio=1.0, clipping_range=8.0)
    assert light[1][0] == 0.0 and light[2][0] == 1.0  # 6: fits, but above half the range
    assert heavy[1][0] == 1.0


def test_encoding_rejects_a_weight_above_max_weight():
    with pytest.raises(ValueError, match="max_weight"):
        encode_update([np.ones(2)], np.ones(1), weight_ratio=1.5, clipping_range=8.0)


def test_decoding_recovers_the_weighted_mean_and_rejects_overflowing_tensors():
    scales = np.array([1.0, 4.0])
    clients = [[np.array([0.2, -0.1]), np.array([10.0])], [np.array([0.4, 0.3]), np.array([40.0])]]
    weights = [30.0, 10.0]
    encoded = [encode_update(c, scales, weight_ratio=w / 30.0, clipping_range=8.0) for c, w in zip(clients, weights)]
    # SecAgg+'s output, without quantisation: the weighted mean of the clipped values, divided back by the ratios.
    total = sum(w / 30.0 for w in weights)
    aggregate = [
        sum(secagg_clip(e, w / 30.0, 8.0)[i] for e, w in zip(encoded, weights)) / total for i in range(len(encoded[0]))
    ]
    decoded = decode_aggregate(aggregate, scales, client_weights=weights)
    np.testing.assert_allclose(decoded.mean[0], (30 * clients[0][0] + 10 * clients[1][0]) / 40, rtol=1e-6, atol=1e-9)
    # 40 / 4 * (10 / 30) = 3.3 fits; the weighted mean 17.5 is recovered exactly.
    assert not decoded.overflow.any()
    np.testing.assert_allclose(decoded.mean[1], [17.5], rtol=1e-6, atol=1e-9)

    tight = np.array([1.0, 1.0])
    encoded = [encode_update(c, tight, weight_ratio=w / 30.0, clipping_range=8.0) for c, w in zip(clients, weights)]
    aggregate = [
        sum(secagg_clip(e, w / 30.0, 8.0)[i] for e, w in zip(encoded, weights)) / total for i in range(len(encoded[0]))
    ]
    decoded = decode_aggregate(aggregate, tight, client_weights=weights)
    assert decoded.overflow.tolist() == [False, True]
    assert np.all(decoded.mean[1] == 0)  # a saturated aggregate is never applied
    np.testing.assert_allclose(decoded.mean[0], (30 * clients[0][0] + 10 * clients[1][0]) / 40, rtol=1e-6, atol=1e-9)
    assert next_scales(tight, decoded).tolist() == [1.0, OVERFLOW_GROWTH]


def test_scales_double_where_a_tensor_ran_high():
    scales = np.array([1.0, 1.0])
    encoded = encode_update([np.array([5.0]), np.array([0.1])], scales, weight_ratio=1.0, clipping_range=8.0)
    decoded = decode_aggregate(encoded, scales, client_weights=[1.0])
    assert next_scales(scales, decoded).tolist() == [HIGH_GROWTH, 1.0]
