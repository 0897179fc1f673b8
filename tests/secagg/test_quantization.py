"""privfed's quantisation gives Flower's integers, bit for bit, from the same draws of NumPy's global generator."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common.secure_aggregation.quantization import quantize as flower_quantize

from privfed.secagg.quantization import quantize

CLIPPING, LEVELS = 8.0, 2**22


def both(arrays: list[np.ndarray], scale: float, clipping: float = CLIPPING, levels: int = LEVELS, seed: int = 0):
    np.random.seed(seed)
    theirs = flower_quantize([a * scale for a in arrays], clipping, levels)
    np.random.seed(seed)
    ours = quantize(arrays, scale=scale, clipping_range=clipping, quantization_range=levels)
    return ours, theirs


def identical(ours: list[np.ndarray], theirs: list[np.ndarray]) -> bool:
    return all(a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("scale", [1.0, 0.37, 1 / 3])
def test_random_updates_quantise_to_flowers_integers(dtype, scale):
    rng = np.random.default_rng(7)
    arrays = [rng.normal(0, 3, shape).astype(dtype) for shape in [(64, 3, 3, 3), (512,), (1,), (10, 10)]]
    assert identical(*both(arrays, scale))


def test_the_clipping_edges_and_exact_levels_quantise_to_flowers_integers():
    step = 2 * CLIPPING / LEVELS
    edges = np.array([-np.inf, -1e30, -CLIPPING - 1e-12, -CLIPPING, -CLIPPING + 1e-12, -step, -0.0, 0.0, 1e-300,
                      step, step / 2, 3 * step, CLIPPING - 1e-12, CLIPPING, CLIPPING + 1e-12, 1e30, np.inf])
    ours, theirs = both([edges, np.repeat(edges, 50)], 1.0)
    assert identical(ours, theirs)
    assert ours[0].min() == 0 and ours[0].max() == LEVELS


def test_odd_shapes_and_small_grids_quantise_to_flowers_integers():
    rng = np.random.default_rng(3)
    arrays = [np.array(0.3), np.zeros(0), rng.uniform(-2, 2, (2, 0, 3)), rng.uniform(-2, 2, (5, 1, 7))]
    for clipping, levels in [(1.0, 16), (4.0, 2**10), (0.5, 3)]:
        assert identical(*both(arrays, 0.8, clipping, levels, seed=levels))


def test_the_draws_left_for_the_next_caller_are_the_ones_flower_leaves():
    arrays = [np.linspace(-9, 9, 1001)]
    both(arrays, 0.5)
    after_ours = np.random.rand()
    np.random.seed(0)
    flower_quantize([a * 0.5 for a in arrays], CLIPPING, LEVELS)
    assert after_ours == np.random.rand()
