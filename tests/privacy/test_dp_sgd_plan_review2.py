"""Review of issue 44: the Poisson memory bound is the Binomial tail bound it says, checked against exact arithmetic.

:func:`poisson_memory_bound` must be the least ``m`` with P(Binomial(n, q) > m) <= 1e-9. The client draws its
memory with ``torch.rand(n) < q`` in float32, so each example joins with a probability a little above ``q``; the
tail is checked at that probability too.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from privfed.privacy.dp_sgd_plan import MEMORY_BOUND_FAILURE, memory_rate, poisson_memory_bound

mpmath.mp.dps = 60


def exact_tail(n: int, p: mpmath.mpf, m: int) -> mpmath.mpf:
    """P(Binomial(n, p) > m), summed term by term at 60 digits."""
    return mpmath.fsum(mpmath.binomial(n, k) * p**k * (1 - p) ** (n - k) for k in range(m + 1, n + 1))


def float32_draw_rate(rate: float) -> mpmath.mpf:
    """P(u < rate) for torch.rand's float32 u, uniform on the multiples of 2**-24 in [0, 1): ``rate`` is compared as
    a float32, so the probability is the count of grid points below float32(rate), over 2**24."""
    threshold = mpmath.mpf(float(np.float32(rate)))
    return mpmath.ceil(threshold * 2**24) / 2**24


SIZES = [(500, 128), (300, 32), (75, 32), (2000, 128), (1000, 999), (129, 128), (5000, 64)]


@pytest.mark.parametrize(("n", "memory"), SIZES, ids=lambda v: str(v))
def test_the_bound_is_the_least_with_an_exact_tail_at_most_the_failure(n, memory):
    bound = poisson_memory_bound(n, memory)
    q = mpmath.mpf(memory_rate(n, memory))
    assert exact_tail(n, q, bound) <= MEMORY_BOUND_FAILURE
    assert bound == 0 or exact_tail(n, q, bound - 1) > MEMORY_BOUND_FAILURE


@pytest.mark.parametrize(("n", "memory"), SIZES, ids=lambda v: str(v))
def test_the_tail_stays_within_the_failure_at_the_rate_the_client_draws_with(n, memory):
    bound = poisson_memory_bound(n, memory)
    assert exact_tail(n, float32_draw_rate(memory_rate(n, memory)), bound) <= MEMORY_BOUND_FAILURE


def test_the_documented_figure_189_for_500_at_memory_128():
    assert poisson_memory_bound(500, 128) == 189
