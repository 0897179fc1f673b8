import itertools

import numpy as np
import pytest
from flwr.common.secure_aggregation.ndarrays_arithmetic import factor_combine, factor_extract
from flwr.common.secure_aggregation.quantization import dequantize, quantize

from privfed.secagg.encoding import (
    HIGH_GROWTH,
    OVERFLOW_GROWTH,
    DecodedAggregate,
    decode_aggregate,
    decode_metrics,
    encode_metrics,
    encode_update,
    initial_scales,
    max_useful_scale,
    next_scales,
    secagg_weight_ratio,
    secure_sum_shapes,
)

QUANTIZATION_RANGE = 2**22


def secagg_clip(arrays: list[np.ndarray], ratio: float, clipping_range: float) -> list[np.ndarray]:
    """What SecAgg+ does to a client's values before quantising them."""
    return [np.clip(a * ratio, -clipping_range, clipping_range) for a in arrays]


def secagg_sum(encoded: list[list[np.ndarray]], sizes: list[int], *, max_weight: float, clipping_range: float):
    """SecAgg+'s fixed-point arithmetic, with Flower's own functions (the masks cancel and are left out).

    Each client multiplies by its rounded weight ratio, quantises stochastically
    and prepends its ratio; the server sums, removes the shifts and divides by
    the total ratio, as Flower 1.41's ``SecAggPlusWorkflow`` does.
    """
    summed = None
    for arrays, n in zip(encoded, sizes):
        q_ratio = round(n / max_weight * QUANTIZATION_RANGE)
        scaled = [a * (q_ratio / QUANTIZATION_RANGE) for a in arrays]
        quantised = factor_combine(q_ratio, quantize(scaled, clipping_range, QUANTIZATION_RANGE))
        summed = quantised if summed is None else [s + q for s, q in zip(summed, quantised)]
    q_total, summed = factor_extract(summed)
    aggregate = dequantize(summed, clipping_range, QUANTIZATION_RANGE)
    offset = -(len(sizes) - 1) * clipping_range
    return [(a + offset) * (QUANTIZATION_RANGE / q_total) for a in aggregate]


def ratio(n: int, max_weight: float) -> float:
    return secagg_weight_ratio(n, max_weight=max_weight, quantization_range=QUANTIZATION_RANGE)


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
    assert light[1][0] == 0.0 and light[2][0] * 0.5 == 1.0  # 6: fits, but above half the range
    assert heavy[1][0] == 1.0


def test_encoding_rejects_a_weight_above_max_weight():
    with pytest.raises(ValueError, match="max_weight"):
        encode_update([np.ones(2)], np.ones(1), weight_ratio=1.5, clipping_range=8.0)


def test_decoding_recovers_the_weighted_mean_and_rejects_overflowing_tensors():
    np.random.seed(0)  # Flower's stochastic rounding draws from NumPy's global generator
    scales = np.array([1.0, 4.0])
    clients = [[np.array([0.2, -0.1]), np.array([10.0])], [np.array([0.4, 0.3]), np.array([40.0])]]
    sizes = [30, 10]
    encoded = [encode_update(c, scales, weight_ratio=ratio(n, 30), clipping_range=8.0) for c, n in zip(clients, sizes)]
    aggregate = secagg_sum(encoded, sizes, max_weight=30, clipping_range=8.0)
    decoded = decode_aggregate(aggregate, scales, weight_ratios=[ratio(n, 30) for n in sizes])
    np.testing.assert_allclose(decoded.mean[0], (30 * clients[0][0] + 10 * clients[1][0]) / 40, atol=1e-5)
    # 40 / 4 * (10 / 30) = 3.3 fits; the weighted mean 17.5 is recovered up to quantisation.
    assert not decoded.overflow.any()
    np.testing.assert_allclose(decoded.mean[1], [17.5], atol=1e-4)

    tight = np.array([1.0, 1.0])
    encoded = [encode_update(c, tight, weight_ratio=ratio(n, 30), clipping_range=8.0) for c, n in zip(clients, sizes)]
    aggregate = secagg_sum(encoded, sizes, max_weight=30, clipping_range=8.0)
    decoded = decode_aggregate(aggregate, tight, weight_ratios=[ratio(n, 30) for n in sizes])
    assert decoded.overflow.tolist() == [False, True]
    assert decoded.overflow_counts.tolist() == [0, 2]  # 10 and 40 * 10/30 both exceed 8
    assert np.all(decoded.mean[1] == 0)  # a saturated aggregate is never applied
    np.testing.assert_allclose(decoded.mean[0], (30 * clients[0][0] + 10 * clients[1][0]) / 40, atol=1e-5)
    assert next_scales(tight, decoded, max_scale=2.0**21).tolist() == [1.0, OVERFLOW_GROWTH]


def test_scales_double_where_a_tensor_ran_high():
    scales = np.array([1.0, 1.0])
    encoded = encode_update([np.array([5.0]), np.array([0.1])], scales, weight_ratio=1.0, clipping_range=8.0)
    decoded = decode_aggregate(encoded, scales, weight_ratios=[1.0])
    assert next_scales(scales, decoded, max_scale=2.0**21).tolist() == [HIGH_GROWTH, 1.0]


def test_a_flag_raised_every_round_grows_the_scale_to_its_cap_and_no_further():
    """One client raising its overflow flag every round grew a scale ×4 a round without end (inf after 512 rounds)."""
    cap = max_useful_scale(2**22)
    assert cap == 2.0**21  # the scale whose step, 2c/Q of it, is the clipping range c itself
    scales = np.array([1.0, 16.0])
    flagged = DecodedAggregate(mean=[np.zeros(1), np.zeros(1)], overflow_counts=np.array([1, 0]), high_counts=np.array([1, 1]))
    for _ in range(40):
        scales = next_scales(scales, flagged, max_scale=cap)
    assert scales.tolist() == [cap, cap]
    assert next_scales(np.array([4 * cap, 1.0]), flagged, max_scale=cap).tolist() == [4 * cap, 2.0]  # never shrunk


def test_the_server_learns_how_many_clients_overflowed_not_which():
    """Sizes are public: indicators weighted by size would sum to a subset sum that names the clients."""
    np.random.seed(1)
    sizes = [3, 17, 40, 112, 250]  # every subset of these has its own weighted sum
    max_weight = 250.0
    scales = np.ones(1)
    aggregates = {}
    for raised in itertools.combinations(range(len(sizes)), 2):
        deltas = [[np.array([1e4 if i in raised else 0.01])] for i in range(len(sizes))]
        encoded = [encode_update(d, scales, weight_ratio=ratio(n, max_weight), clipping_range=8.0)
                   for d, n in zip(deltas, sizes)]
        indicators = secagg_sum(encoded, sizes, max_weight=max_weight, clipping_range=8.0)[1:]
        decoded = decode_aggregate([np.zeros(1), *indicators], scales, weight_ratios=[ratio(n, max_weight) for n in sizes])
        assert decoded.overflow_counts.tolist() == [2]
        aggregates[raised] = np.concatenate(indicators)
    first = next(iter(aggregates.values()))
    for raised, aggregate in aggregates.items():
        assert np.array_equal(aggregate, first), f"clients {raised} are told apart by the aggregate"


def test_one_small_client_overflowing_among_large_ones_is_counted():
    np.random.seed(2)
    sizes = [1, 5000, 5000, 5000]
    deltas = [[np.array([9.0])], [np.array([0.1])], [np.array([0.1])], [np.array([0.1])]]
    encoded = [encode_update(d, np.ones(1), weight_ratio=ratio(n, 5000.0), clipping_range=8.0)
               for d, n in zip(deltas, sizes)]
    decoded = decode_aggregate(secagg_sum(encoded, sizes, max_weight=5000.0, clipping_range=8.0), np.ones(1),
                               weight_ratios=[ratio(n, 5000.0) for n in sizes])
    # 9 * 1/5000 fits the range, so nothing overflowed, but nothing was lost either
    assert decoded.overflow_counts.tolist() == [0]
    deltas[0] = [np.array([9.0 * 5000])]
    encoded[0] = encode_update(deltas[0], np.ones(1), weight_ratio=ratio(1, 5000.0), clipping_range=8.0)
    decoded = decode_aggregate(secagg_sum(encoded, sizes, max_weight=5000.0, clipping_range=8.0), np.ones(1),
                               weight_ratios=[ratio(n, 5000.0) for n in sizes])
    assert decoded.overflow_counts.tolist() == [1]


def test_a_clipping_range_below_one_cannot_carry_the_indicators():
    with pytest.raises(ValueError, match="at least 1"):
        encode_update([np.ones(2)], np.ones(1), weight_ratio=1.0, clipping_range=0.5)


def test_the_weight_ratio_is_rounded_as_secagg_rounds_it():
    assert ratio(1, 3.0) == round(QUANTIZATION_RANGE / 3) / QUANTIZATION_RANGE
    with pytest.raises(ValueError, match="max_weight"):
        ratio(4, 3.0)


@pytest.mark.parametrize("clipping_range,exact", [(8.0, True), (1.0, True), (16.0, True), (3.0, False), (1.5, False), (10.0, False)])
def test_only_ranges_that_put_a_raised_flag_on_the_grid_are_accepted(clipping_range, exact):
    """Off the grid, each client's (server-predictable) stochastic rounding of its flag would say who raised it."""
    from privfed.secagg.settings import indicators_are_exact

    assert indicators_are_exact(clipping_range, QUANTIZATION_RANGE) == exact
    if not exact:
        with pytest.raises(ValueError, match="power of two"):
            encode_update([np.ones(2)], np.ones(1), weight_ratio=1.0, clipping_range=clipping_range,
                          quantization_range=QUANTIZATION_RANGE)


def test_a_delta_that_is_not_finite_is_refused_before_secagg_quantises_it():
    """SecAgg+ would turn a NaN into a large wrong value that no indicator flags."""
    with pytest.raises(ValueError, match="NaN or Inf"):
        encode_update([np.array([0.1, np.nan])], np.ones(1), weight_ratio=1.0, clipping_range=8.0)



def test_training_metrics_reach_the_server_only_as_weighted_means_over_the_clients_that_report_them():
    np.random.seed(3)
    sizes = [30, 10, 20]
    metrics = [{"loss": 4.0, "target_entropy": 0.9}, {"loss": 2.0}, {"loss": 6.0, "target_entropy": 0.3, "steps": 12.0}]
    encoded = [[encode_metrics(m, clipping_range=8.0)] for m in metrics]
    (aggregate,) = secagg_sum(encoded, sizes, max_weight=30.0, clipping_range=8.0)
    means = decode_metrics(aggregate)
    assert means["loss"] == pytest.approx((30 * 4 + 10 * 2 + 20 * 6) / 60, abs=1e-3)
    assert means["target_entropy"] == pytest.approx((30 * 0.9 + 20 * 0.3) / 50, abs=1e-3)
    assert means["steps"] == pytest.approx(12.0, abs=1e-2)
    assert "rotation_loss" not in means


def test_secure_sum_shapes_are_the_shapes_a_client_hands_to_secagg():
    shapes = [(4, 3, 3, 3), (4,), ()]
    delta = [np.ones(shape) for shape in shapes]
    arrays = encode_update(delta, np.ones(3), weight_ratio=0.5, clipping_range=8.0)
    assert [a.shape for a in arrays] == secure_sum_shapes(shapes, metrics=False)
    arrays.append(encode_metrics({"loss": 1.0}, clipping_range=8.0))  # --report-client-metrics
    assert [a.shape for a in arrays] == secure_sum_shapes(shapes, metrics=True)


#: The review's setting: 10 clients, participation 0.5, 60 rounds.
CLIENTS, PER_ROUND, ROUNDS = 10, 5, 60


def cohorts(seed: int = 0) -> list[list[int]]:
    """Each round's sampled clients, drawn as the strategy draws them; the server knows every one."""
    rng = np.random.default_rng(seed)
    return [sorted(int(c) for c in rng.choice(CLIENTS, size=PER_ROUND, replace=False)) for _ in range(ROUNDS)]


def cohort_weights(cohort: list[int], sizes: np.ndarray, max_weight: float) -> np.ndarray:
    """The public weights of one round's mean: each member's SecAgg+ weight ratio over their total."""
    weights = np.zeros(CLIENTS)
    weights[cohort] = [ratio(int(sizes[c]), max_weight) for c in cohort]
    return weights / weights.sum()


def smooth_trend_basis(degree: int = 4) -> np.ndarray:
    """``[ROUNDS, degree]`` Legendre polynomials 1..degree over the rounds (the constant is left to the clients)."""
    t = np.linspace(-1.0, 1.0, ROUNDS)
    return np.stack([np.polynomial.legendre.Legendre.basis(d)(t) for d in range(1, degree + 1)], axis=1)


def test_metric_means_over_changing_cohorts_reveal_each_clients_own_loss_up_to_one_offset():
    """The privacy statement's claim for --report-client-metrics: an honest server that knows the cohorts and the
    public weights solves the SecAgg+ round means for every client's own loss by least squares across rounds."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(20, 200, size=CLIENTS)
    max_weight = float(sizes.max())
    own = rng.normal(0.0, 0.3, size=CLIENTS)  # each client's own level, which the round means were said to hide
    trend = 2.0 + 1.5 * np.exp(-np.arange(ROUNDS) / 15)  # the loss falls smoothly over the run
    losses = own[:, None] + trend[None, :] + rng.normal(0.0, 0.01, size=(CLIENTS, ROUNDS))
    np.random.seed(4)  # SecAgg+'s stochastic rounding
    means, rows = [], []
    for r, cohort in enumerate(cohorts()):
        encoded = [[encode_metrics({"loss": float(losses[c, r])}, clipping_range=8.0)] for c in cohort]
        (aggregate,) = secagg_sum(encoded, [int(sizes[c]) for c in cohort], max_weight=max_weight, clipping_range=8.0)
        means.append(decode_metrics(aggregate)["loss"])  # what the server logs for the round
        rows.append(cohort_weights(cohort, sizes, max_weight))
    design = np.hstack([np.array(rows), smooth_trend_basis()])
    solution, *_ = np.linalg.lstsq(design, np.array(means), rcond=None)
    recovered = solution[:CLIENTS]
    error = (recovered - recovered.mean()) - (own - own.mean())  # one common offset is all that is left unknown
    assert np.corrcoef(recovered, own)[0, 1] > 0.99 and np.abs(error).max() < 0.05
    # What makes it work is the changing cohort: had the same clients taken part every round, it could not.
    fixed = np.hstack([np.array([cohort_weights(cohorts()[0], sizes, max_weight)] * ROUNDS), smooth_trend_basis()])
    assert np.linalg.matrix_rank(fixed) < CLIENTS


def test_overflow_counts_over_changing_cohorts_name_the_client_whose_update_overflows():
    """Each round shows only a count; across rounds the known cohorts attribute it (the statement says so)."""
    np.random.seed(5)
    sizes = np.random.default_rng(1).integers(20, 200, size=CLIENTS)
    max_weight, culprit = float(sizes.max()), 3
    counts, rows = [], []
    for cohort in cohorts(seed=1):
        deltas = [[np.array([1e4 if c == culprit else 0.01])] for c in cohort]
        encoded = [encode_update(d, np.ones(1), weight_ratio=ratio(int(sizes[c]), max_weight), clipping_range=8.0)
                   for d, c in zip(deltas, cohort)]
        indicators = secagg_sum(encoded, [int(sizes[c]) for c in cohort], max_weight=max_weight, clipping_range=8.0)[1:]
        ratios = [ratio(int(sizes[c]), max_weight) for c in cohort]
        counts.append(decode_aggregate([np.zeros(1), *indicators], np.ones(1), weight_ratios=ratios).overflow_counts[0])
        rows.append(np.isin(np.arange(CLIENTS), cohort).astype(float))
    assert set(counts) == {0, 1}  # no single round says who
    rates, *_ = np.linalg.lstsq(np.array(rows), np.array(counts, dtype=float), rcond=None)
    assert np.allclose(rates, np.eye(CLIENTS)[culprit], atol=1e-6)


def test_an_aggregate_outside_the_clipping_range_or_not_finite_is_refused():
    from privfed.secagg.encoding import ImplausibleAggregate

    honest = [np.full(3, 7.9), np.zeros(1), np.zeros(1)]
    assert decode_aggregate(honest, np.ones(1), weight_ratios=[1.0], clipping_range=8.0).mean[0][0] == pytest.approx(7.9)
    for bad in (np.inf, np.nan, 9.0):
        with pytest.raises(ImplausibleAggregate):
            decode_aggregate([np.full(3, bad), np.zeros(1), np.zeros(1)], np.ones(1), weight_ratios=[1.0], clipping_range=8.0)
