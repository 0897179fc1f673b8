"""Exact integer noise drawn from a cryptographically secure source.

Floating-point samplers do not draw the distribution the proof assumes: their
outputs land on an input-dependent set of doubles, which can tell inputs apart
(Mironov, CCS 2012); here a release is ``integer data + integer noise``,
sampled exactly from rational parameters. Seeded PRNGs are predictable, so
every bit comes from a :class:`random.Random`, by default
:class:`secrets.SystemRandom` (tests may pass a seeded one). The samplers use
integer comparisons only (Canonne, Kamath and Steinke, NeurIPS 2020, Algorithms
1-3), vectorised: each rejection round re-draws only the rejected entries.
Integers that would overflow 63 bits fall back to Python ints (exact, slower).
"""

from __future__ import annotations

import math
import random
import secrets
from fractions import Fraction

import numpy as np

_INT63 = 2**63

#: Discrete-Laplace decays the sampler draws: a float decay rounded down to a multiple of ``2**-24`` is zero below
#: ``MIN_DECAY``; above ``MAX_DECAY`` its numerator overflows 64 bits (and the noise is almost surely zero).
MIN_DECAY, MAX_DECAY = 2.0**-24, 2.0**32
#: Largest discrete-Gaussian sigma drawn: samples (a few dozen sigma at most) stay far inside 64-bit integers.
MAX_SIGMA = 2.0**48
#: Smallest sigma drawn: below about 1e-10 the sampler's exponent overflows; at 2^-24 every draw is 0 anyway.
MIN_SIGMA = 2.0**-24


def check_decay(parameter: float | Fraction) -> None:
    """Refuses (ValueError) a decay :func:`discrete_laplace` cannot draw; a Fraction, drawn as it is, needs
    0 < numerator and both parts below ``2**62``."""
    if isinstance(parameter, Fraction):
        if 0 < parameter.numerator < 2**62 and parameter.denominator < 2**62:
            return
        raise ValueError(f"discrete-Laplace decay {parameter!r} cannot be drawn: it needs 0 < s/t with s, t < 2**62")
    if not (isinstance(parameter, (int, float)) and MIN_DECAY <= parameter <= MAX_DECAY):
        raise ValueError(
            f"discrete-Laplace decay {parameter!r} cannot be drawn: the sampler takes decays in "
            f"[2**-24, 2**32] ({MIN_DECAY:.3g} to {MAX_DECAY:.3g})"
        )


def check_sigma(sigma: float | Fraction) -> None:
    """Refuses (ValueError) a sigma :func:`discrete_gaussian` cannot draw."""
    if not (isinstance(sigma, (int, float, Fraction)) and MIN_SIGMA <= sigma <= MAX_SIGMA):
        raise ValueError(f"discrete-Gaussian sigma {sigma!r} cannot be drawn: the sampler takes 2**-24 <= sigma <= 2**48")


def secure_source() -> random.Random:
    """The default randomness: the operating system's CSPRNG."""
    return secrets.SystemRandom()


def _random_words(source: random.Random, count: int) -> np.ndarray:
    """``count`` uniform 64-bit words (``randbytes`` is ``os.urandom`` for SystemRandom)."""
    return np.frombuffer(source.randbytes(8 * count), dtype=np.uint64).copy()


#: Resolution of :func:`poisson_sample_mask`'s coins: rates are rounded down to a multiple of ``2**-53``.
_RATE_BITS = 53


def poisson_sample_mask(count: int, rate: float, *, source: random.Random | None = None) -> np.ndarray:
    """``count`` independent coins of probability at most ``rate``: a Poisson sample's membership.

    ``rate`` is rounded down to a multiple of ``2**-53``, so an accountant
    that assumes ``rate`` overcharges, never undercharges.
    """
    if not 0 < rate <= 1:
        raise ValueError(f"a sampling rate must be in (0, 1], got {rate!r}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    source = source or secure_source()
    cut = np.uint64(math.floor(rate * 2**_RATE_BITS))
    return (_random_words(source, count) >> np.uint64(64 - _RATE_BITS)) < cut


def uniform_below(bounds: np.ndarray, *, source: random.Random | None = None) -> np.ndarray:
    """Uniform integers ``0 <= u < bound`` for each of ``bounds`` (``int64``, or ``object`` ints), exactly.

    Bounds below ``2**63`` together: a 64-bit word ``w`` is kept when
    ``w >= 2**64 mod bound`` (leaving a multiple of ``bound`` equally likely
    words), then ``w mod bound`` is uniform. Larger ones use ``randrange``.
    The result is ``int64`` if every bound fits, else ``object``.
    """
    source = source or secure_source()
    bounds = np.asarray(bounds)
    if bounds.dtype == object:
        big = np.array([int(b) >= _INT63 for b in bounds], dtype=bool)
        if not big.any():
            return uniform_below(bounds.astype(np.int64), source=source)
        out = np.empty(bounds.shape[0], dtype=object)
        small = ~big
        if small.any():
            out[small] = uniform_below(bounds[small].astype(np.int64), source=source).astype(object)
        out[big] = [source.randrange(int(b)) for b in bounds[big]]
        return out
    if bounds.size and bounds.min() < 1:
        raise ValueError("bounds must be positive")
    b = bounds.astype(np.uint64)
    out = np.empty(b.shape[0], dtype=np.int64)
    pending = np.arange(b.shape[0])
    while pending.size:
        bp = b[pending]
        words = _random_words(source, pending.size)
        floor = (np.uint64(0) - bp) % bp  # 2**64 mod bound, in wrapping uint64 arithmetic
        ok = words >= floor
        out[pending[ok]] = (words[ok] % bp[ok]).astype(np.int64)
        pending = pending[~ok]
    return out


def _as_int_array(values: np.ndarray) -> np.ndarray:
    """int64 when every entry fits, else an object array of Python ints."""
    values = np.asarray(values)
    if values.dtype != object:
        return values.astype(np.int64)
    if values.size == 0 or max(abs(int(v)) for v in values) < _INT63 // 4:
        return values.astype(np.int64)
    return values


def _bernoulli_exp_unit(num: np.ndarray, den: np.ndarray, source: random.Random) -> np.ndarray:
    """``Bernoulli(exp(-num/den))`` for ``0 <= num <= den`` (CKS Algorithm 1).

    Draws ``A_k ~ Bernoulli(gamma/k)``, ``k = 1, 2, ...``, until the first
    failure, whose index is odd with probability exactly ``exp(-gamma)``.
    """
    n = num.shape[0]
    k = np.ones(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        dens, ks = den[active], k[active]
        if den.dtype != object and int(dens.max()) * int(ks.max()) < _INT63:
            bound = dens * ks
        else:  # the product could overflow 64 bits: multiply as Python ints
            bound = _as_int_array(dens.astype(object) * ks.astype(object))
        success = uniform_below(bound, source=source) < num[active]
        success = np.asarray(success, dtype=bool)
        k[active[success]] += 1
        active = active[success]
    return k % 2 == 1


def _geometric_exp1(count: int, source: random.Random) -> np.ndarray:
    """Number of successes of ``Bernoulli(exp(-1))`` before the first failure."""
    out = np.zeros(count, dtype=np.int64)
    active = np.arange(count)
    ones = np.ones(count, dtype=np.int64)
    while active.size:
        hit = _bernoulli_exp_unit(ones[: active.size], ones[: active.size], source)
        out[active[hit]] += 1
        active = active[hit]
    return out


def bernoulli_exp(num: np.ndarray, den: int | np.ndarray, *, source: random.Random | None = None) -> np.ndarray:
    """``Bernoulli(exp(-num/den))`` for non-negative integers (``int64`` or ``object``), exactly.

    With ``g = floor(num/den)``: true when ``g`` independent ``Bernoulli(exp(-1))``
    all succeed and a final ``Bernoulli(exp(-remainder))`` does.
    """
    source = source or secure_source()
    num = np.asarray(num)
    den_arr = np.broadcast_to(np.asarray(den, dtype=num.dtype if num.dtype == object else None), num.shape)
    if num.dtype == object or den_arr.dtype == object:
        num, den_arr = num.astype(object), den_arr.astype(object)
    else:
        num, den_arr = num.astype(np.int64), den_arr.astype(np.int64)
    whole = num // den_arr
    rest = num - whole * den_arr
    result = np.ones(num.shape[0], dtype=bool)
    needs_whole = np.flatnonzero(whole > 0)
    if needs_whole.size:
        runs = _geometric_exp1(needs_whole.size, source)
        result[needs_whole] = runs >= whole[needs_whole].astype(np.int64)
    survivors = np.flatnonzero(result)
    if survivors.size:
        result[survivors] = _bernoulli_exp_unit(rest[survivors], den_arr[survivors], source)
    return result


def rational_at_most(value: float | Fraction, *, denominator: int = 2**24) -> Fraction:
    """A rational ``<= value`` with the given denominator (a Fraction as it is): a decay rounded *down* adds
    more noise than the accountant was told of, never less."""
    if isinstance(value, Fraction):
        return value
    if value <= 0:
        raise ValueError(f"value must be positive, got {value}")
    num = math.floor(Fraction(value) * denominator)
    if num == 0:
        raise ValueError(f"value {value} is below 1/{denominator}; pass a Fraction")
    return Fraction(num, denominator)


def variance_at_least(sigma: float | Fraction) -> Fraction:
    """``sigma**2`` rounded *up* (more noise) to a short denominator, so the sampler's numbers stay in 64 bits:
    an integer for large variances, about six significant digits for small ones."""
    if isinstance(sigma, Fraction):
        return sigma * sigma
    if sigma <= 0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    exact = Fraction(sigma) ** 2
    scale = 1 if exact >= 10**6 else 2 ** math.ceil(math.log2(10**6 / exact))
    return Fraction(math.ceil(exact * scale), scale)


def discrete_laplace(
    size: int, *, parameter: float | Fraction, source: random.Random | None = None
) -> np.ndarray:
    """``size`` discrete-Laplace draws (``int64``), ``P(k) proportional to exp(-parameter * |k|)``.

    ``dp_accounting``'s ``DiscreteLaplaceDpEvent(noise_parameter)``: added to
    integer counts of sensitivity ``s`` it is ``(s * parameter)``-DP. A float
    ``parameter`` is rounded down to a multiple of ``2**-24`` (more noise); a
    ``Fraction`` is sampled exactly.
    """
    check_decay(parameter)
    source = source or secure_source()
    decay = rational_at_most(parameter)
    return _discrete_laplace_rational(size, decay.numerator, decay.denominator, source)


def _discrete_laplace_rational(size: int, s: int, t: int, source: random.Random) -> np.ndarray:
    """CKS Algorithm 2: ``P(k) proportional to exp(-|k| * s/t)`` for integers s, t."""
    chunks: list[np.ndarray] = []
    missing = size
    while missing > 0:
        batch = int(missing * 2.5) + 16
        u = uniform_below(np.full(batch, t, dtype=np.int64), source=source)
        u = u[bernoulli_exp(u, t, source=source)]  # accepts u with prob. exp(-u/t)
        v = _geometric_exp1(u.shape[0], source)
        if v.size and t * (int(v.max()) + 1) >= _INT63:  # int64 would wrap silently: multiply as Python ints
            magnitude = _as_int_array((u.astype(object) + t * v.astype(object)) // s)
        else:
            magnitude = (u + t * v) // s
        signs = np.frombuffer(source.randbytes((magnitude.shape[0] + 7) // 8), dtype=np.uint8)
        negative = np.unpackbits(signs)[: magnitude.shape[0]].astype(bool)
        keep = ~(negative & (magnitude == 0))  # zero must not be counted twice
        chunks.append(np.where(negative, -magnitude, magnitude)[keep])
        missing -= int(keep.sum())
    return np.concatenate(chunks)[:size] if chunks else np.zeros(0, dtype=np.int64)


def discrete_laplace_variance(parameter: float) -> float:
    """Variance of the discrete Laplace with decay ``parameter``: ``2q/(1-q)^2``, ``q = e^-a``."""
    q = math.exp(-parameter)
    return 2.0 * q / (1.0 - q) ** 2


def discrete_gaussian(
    size: int, *, sigma: float | Fraction, source: random.Random | None = None
) -> np.ndarray:
    """``size`` discrete-Gaussian draws (``int64``), ``P(k) proportional to exp(-k^2 / (2 sigma^2))``.

    CKS Algorithm 3: a discrete-Laplace candidate ``y`` of scale
    ``t = floor(sigma) + 1`` is kept with probability
    ``exp(-(|y| - sigma^2/t)^2 / (2 sigma^2))``, an exact rational. A float
    ``sigma`` has ``sigma**2`` rounded *up* first (:func:`variance_at_least`);
    for sigma >= 1 the standard deviation is sigma to ``1e-10`` relative.
    """
    check_sigma(sigma)
    source = source or secure_source()
    var = variance_at_least(sigma)
    p, q = var.numerator, var.denominator  # sigma^2 = p/q
    t = math.isqrt(p // q) + 1  # floor(sigma) + 1
    den = 2 * p * q * t * t
    chunks: list[np.ndarray] = []
    missing = size
    while missing > 0:
        batch = int(missing * 1.6) + 16
        y = _discrete_laplace_rational(batch, 1, t, source)
        # (|y| - sigma^2/t)^2 / (2 sigma^2) = (|y| t q - p)^2 / (2 p q t^2)
        offset = np.abs(y).astype(object) * (t * q) - p
        accept = bernoulli_exp(_as_int_array(offset * offset), den, source=source)
        chunks.append(y[accept])
        missing -= int(accept.sum())
    return np.concatenate(chunks)[:size] if chunks else np.zeros(0, dtype=np.int64)

