import math
import random

import numpy as np
import pytest

from mechanisms import noise
from mechanisms.noise import (
    bernoulli_exp,
    discrete_gaussian,
    discrete_laplace,
    discrete_laplace_variance,
    uniform_below,
)

N = 20_000


def discrete_gaussian_variance(sigma: float) -> float:
    """Exact variance of the discrete Gaussian (numerical sum over the support)."""
    tail = int(12 * sigma) + 10
    k = np.arange(-tail, tail + 1, dtype=np.float64)
    w = np.exp(-(k**2) / (2 * sigma**2))
    return float((w * k**2).sum() / w.sum())


def _z(sample_var: float, true_var: float, kurtosis_excess: float, n: int) -> float:
    """Standard score of a sample variance (its SE is var * sqrt((kurt_excess + 2) / n))."""
    return (sample_var - true_var) / (true_var * math.sqrt((kurtosis_excess + 2) / n))


def test_default_source_is_the_os_csprng():
    assert isinstance(noise.secure_source(), random.SystemRandom)


def test_uniform_below_is_uniform_and_handles_huge_bounds():
    src = random.Random(0)
    u = uniform_below(np.full(30_000, 6, dtype=np.int64), source=src)
    counts = np.bincount(u, minlength=6)
    expected = 30_000 / 6
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 20.5  # 99.9% quantile of chi2 with 5 degrees of freedom
    big = np.array([2**70, 3, 2**65 + 1], dtype=object)
    out = uniform_below(big, source=src)
    assert all(0 <= int(v) < int(b) for v, b in zip(out, big))


@pytest.mark.parametrize("num,den", [(1, 3), (5, 2), (0, 7), (7, 7)])
def test_bernoulli_exp_frequency(num, den):
    draws = bernoulli_exp(np.full(N, num, dtype=np.int64), den, source=random.Random(1))
    p = math.exp(-num / den)
    assert abs(draws.mean() - p) < 4.5 * math.sqrt(p * (1 - p) / N) + 1e-12


@pytest.mark.parametrize("parameter", [0.05, 0.5, 2.0])
def test_discrete_laplace_matches_its_pmf_and_variance(parameter):
    x = discrete_laplace(N, parameter=parameter, source=random.Random(2))
    assert x.dtype == np.int64 and x.shape == (N,)
    var = discrete_laplace_variance(parameter)
    # excess kurtosis of the discrete Laplace is at most the continuous one's (3)
    assert abs(_z(x.var(), var, 3.0, N)) < 4.5
    assert abs(x.mean()) < 4.5 * math.sqrt(var / N)
    # shape: P(0) = tanh(a/2) and P(|X| = 1) = 2 e^-a tanh(a/2)
    p0 = math.tanh(parameter / 2)
    assert abs((x == 0).mean() - p0) < 4.5 * math.sqrt(p0 * (1 - p0) / N)
    p1 = 2 * math.exp(-parameter) * p0
    assert abs((np.abs(x) == 1).mean() - p1) < 4.5 * math.sqrt(p1 * (1 - p1) / N)


@pytest.mark.parametrize("sigma", [0.8, 3.0, 250.0, 5e4, 2e6])  # 5e4 once overflowed a uint64 -> int64 cast
def test_discrete_gaussian_matches_its_variance_and_shape(sigma):
    x = discrete_gaussian(N, sigma=sigma, source=random.Random(3))
    assert x.dtype == np.int64 and x.shape == (N,)
    var = discrete_gaussian_variance(sigma) if sigma < 1e4 else sigma**2
    assert abs(_z(x.var(), var, 0.0, N)) < 4.5
    assert abs(x.mean()) < 4.5 * math.sqrt(var / N)
    # Gaussian shape: the fraction within one sigma matches the discrete Gaussian's
    if sigma < 1e4:
        k = np.arange(-int(12 * sigma) - 10, int(12 * sigma) + 11)
        pmf = np.exp(-(k**2) / (2 * sigma**2))
        p_in = pmf[np.abs(k) <= sigma].sum() / pmf.sum()
    else:
        p_in = math.erf(1 / math.sqrt(2))
    inside = (np.abs(x) <= sigma).mean()
    assert abs(inside - p_in) < 4.5 * math.sqrt(p_in * (1 - p_in) / N)


def test_small_discrete_gaussian_matches_the_exact_pmf():
    sigma = 1.0
    x = discrete_gaussian(N, sigma=sigma, source=random.Random(4))
    support = np.arange(-8, 9)
    pmf = np.exp(-(support**2) / 2.0)
    pmf /= pmf.sum()
    observed = np.array([(x == k).sum() for k in support])
    mask = pmf * N > 5
    chi2 = (((observed - N * pmf) ** 2) / (N * pmf))[mask].sum()
    assert mask.sum() == 7  # |k| <= 3
    assert chi2 < 24.3  # 99.9% quantile of chi2 with 7 degrees of freedom


def test_seeded_source_reproduces_and_default_does_not_repeat():
    a = discrete_gaussian(100, sigma=10.0, source=random.Random(5))
    b = discrete_gaussian(100, sigma=10.0, source=random.Random(5))
    assert np.array_equal(a, b)
    assert not np.array_equal(discrete_gaussian(100, sigma=10.0), discrete_gaussian(100, sigma=10.0))


def test_ten_thousand_samples_of_each_come_whole_from_the_secure_source():
    """The sizes benchmarks/accounting_cost.py times (no timing here: a loaded machine would fail it)."""
    laplace = discrete_laplace(10_000, parameter=0.1)
    gaussian = discrete_gaussian(10_000, sigma=1000.0)
    for samples in (laplace, gaussian):
        assert samples.shape == (10_000,) and np.issubdtype(samples.dtype, np.integer)
    assert np.unique(gaussian).size > 1000  # sigma 1000: spread out, not a constant


@pytest.mark.parametrize("decay", [1e-9, 2.0**-25, 0.0, -1.0, 2.0**33, float("nan"), float("inf")])
def test_a_decay_the_laplace_sampler_cannot_draw_is_refused_by_name(decay):
    with pytest.raises(ValueError, match="cannot be drawn"):
        discrete_laplace(3, parameter=decay, source=random.Random(0))


@pytest.mark.parametrize("decay", [noise.MIN_DECAY, noise.MAX_DECAY])
def test_the_ends_of_the_laplace_samplers_range_are_drawn(decay):
    assert discrete_laplace(50, parameter=decay, source=random.Random(0)).dtype == np.int64


@pytest.mark.parametrize("sigma", [0.0, -2.0, 1e-10, 1e-300, 2.0**49, float("nan"), float("inf")])
def test_a_sigma_the_gaussian_sampler_cannot_draw_is_refused_by_name(sigma):
    with pytest.raises(ValueError, match="cannot be drawn"):
        discrete_gaussian(3, sigma=sigma, source=random.Random(0))


def test_the_smallest_sigma_is_drawn():
    assert not discrete_gaussian(100, sigma=noise.MIN_SIGMA, source=random.Random(0)).any()


def test_the_largest_sigma_is_drawn():
    sample = discrete_gaussian(2000, sigma=noise.MAX_SIGMA, source=random.Random(0)).astype(np.float64)
    assert abs(sample.std() / noise.MAX_SIGMA - 1) < 0.1


def test_laplace_candidates_past_63_bits_are_computed_exactly_not_wrapped():
    """Decay 1 written as 2**61 / 2**61: ``u + t v`` passes 2**63 once v >= 4, which int64 would wrap."""
    sample = noise._discrete_laplace_rational(20_000, 2**61, 2**61, random.Random(0))
    assert (np.abs(sample) >= 5).sum() > 80  # about 190 expected; wrapped, none reached 5
    assert abs(sample.var() / discrete_laplace_variance(1.0) - 1) < 0.1
