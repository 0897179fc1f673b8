"""Encoding for the distributed discrete Gaussian: real vectors to integers mod ``m`` and back.

Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian Mechanism for
Federated Learning with Secure Aggregation" (ICML 2021, arXiv:2102.06387),
have every client add a *share* of discrete Gaussian noise to an integer
encoding of its vector; a secure sum mod ``m`` (here SecAgg+) reveals only the
total. This module is the encoding and decoding core, as pure functions; the
mechanism that uses it, its accounting and its wiring live elsewhere. It
claims no privacy guarantee: it states the numbers an accountant needs.

A client holding ``x`` in ``R^d`` with ``||x||_2 <= c`` (the caller clips):

1. **Scale** by ``1/gamma`` (:func:`choose_scale`): one integer step is
   ``gamma`` data units, the integer-unit norm bound is ``c / gamma``.
2. **Rotate** (:func:`rotate`): zero-pad to ``d' = 2^ceil(log2 d)`` and apply
   ``H D / sqrt(d')``, ``H`` the Walsh-Hadamard matrix, ``D`` random signs from a
   *public* seed. The map is orthonormal, so it keeps every L2 norm, and it
   spreads the vector's mass evenly: each coordinate of a rotated ``v`` is
   subgaussian with variance proxy ``||v||^2 / d'`` whatever ``v`` is. That
   keeps the coordinates of the sum small, so wrapping around ``m`` is rare.
   The seed is public and the same for every client (the sum must decode);
   it can be fresh each round.
3. **Round** (:func:`conditional_randomized_round`): each coordinate goes to
   its floor or its ceiling, up with probability equal to its fractional
   part (unbiased, variance at most 1/4), and the whole draw is repeated
   until the rounded vector's norm is at most ``Delta_2``
   (:func:`rounded_norm_bound`). Rounding alone can grow the norm by up to
   ``sqrt(d')``; conditioning caps the growth at a bound that holds with
   probability ``1 - beta`` per try anyway, so retries are few. The check is
   exact integer arithmetic, so ``||rounded||_2 <= Delta_2`` always holds,
   whatever floating-point error the rotation made. Conditioning biases the
   rounding slightly towards shorter vectors, the more the more tries fail;
   Hoeffding's bound below is loose, so most first tries pass in practice.
4. **Noise share**: add discrete Gaussian noise of scale ``sigma_share``
   (integer units) per coordinate, from :func:`mechanisms.noise.discrete_gaussian`
   (exact, OS CSPRNG by default).
5. **Reduce mod m** into ``[0, m)``: the vector SecAgg+ sums.

The server's modular sum of ``K`` shares, mapped to ``[-m/2, m/2)``
(:func:`centred_residue`), is the true integer sum whenever every coordinate
of that sum lies in the centred range, however often the partial sums
wrapped. :func:`decode_sum` then unrotates, multiplies by ``gamma`` and drops
the padding: ``sum_k x_k`` plus ``gamma`` times the unrotated rounding errors
and noise. Per coordinate the noise is the sum of ``K`` independent discrete
Gaussians of scale ``sigma_share``, which is close to (not exactly) a discrete
Gaussian of variance ``K sigma_share^2``.

The rounded-norm bound (the paper conditions its rounding on a bound of this
form; the derivation here stands on its own). Write the
scaled, rotated ``x`` as ``y`` with ``||y|| <= c'`` (``c' = c / gamma``) and its
rounding as ``y~ = y + e``. Coordinate ``i`` of ``||y~||^2`` takes one of
``floor(y_i)^2`` and ``ceil(y_i)^2``, two values at most ``2|y_i| + 1`` apart, and
``E ||y~||^2 = ||y||^2 + sum_i p_i (1 - p_i) <= c'^2 + d'/4``. Hoeffding's
inequality over the ``d'`` independent coordinates, with ``sum_i (2|y_i| + 1)^2
<= (2 c' + sqrt(d'))^2`` (triangle inequality), gives
``P(||y~||^2 > c'^2 + d'/4 + sqrt(2 log(1/beta)) (c' + sqrt(d')/2)) <= beta``.
Independently ``|e_i| < 1``, so ``||y~|| < c' + sqrt(d')`` always. Hence

    Delta_2^2 = min(c'^2 + d'/4 + sqrt(2 log(1/beta)) (c' + sqrt(d')/2), (c' + sqrt(d'))^2),

and one try fails with probability at most ``beta``. ``beta`` does not enter
a privacy bound (the check enforces ``Delta_2`` exactly); it only trades a
tighter ``Delta_2`` for more retries. The default, ``exp(-1/2)``, allows a
try to fail with probability up to 0.61; measured first tries fail 2-6 % of
the time.

A table is one vector. The ``ddp-sums`` table (``G`` cells by ``D + 1``
columns) is flattened (``table.ravel()``) and encoded as one vector of
``G (D + 1)`` entries, padded to a power of two, and the decoded vector is
reshaped back. Why not row by row: the bound that privacy needs is on the
whole table's L2 norm (a row can move between cells, one client's rows can
all sit in one cell), and conditional rounding bounds exactly the norm of
what it rounds; per-row rounding would need a per-row norm bound, which a
table does not have, and would pay ``sqrt(d')`` of rounding growth per row
instead of once. Flattening also lets the rotation spread the large count
column over all coordinates. The price: padding to a power of two can
almost double the length (``64 x 129 = 8256`` entries pad to ``16384``), which
costs communication and adds up to ``d'/4`` to ``Delta_2^2``; the mechanism
may lay out its table to pad less.

What the later accounting needs, all in integer units:

* ``Delta_2 = rounded_norm_bound(c / gamma, dim=padded_dimension(d), beta=beta)``:
  every client's encoded vector (before noise) has L2 norm at most
  ``Delta_2``, so two of them differ by at most ``2 Delta_2``; the mechanism
  turns its neighbouring relation into a sensitivity from these;
* ``sigma_share``, the per-client noise scale, and ``K_min``, the fewest
  clients whose shares are guaranteed to be in the sum (SecAgg+'s survival
  threshold): the noise in the sum is at least ``K_min`` shares. The
  paper's analysis of a sum of discrete Gaussians adds a correction
  that grows quickly once ``sigma_share`` falls below about 1;
* the padded dimension ``d'`` (the noise has ``d'`` coordinates, the
  correction above grows with it), ``gamma`` and ``m`` (public).

Nothing here draws from numpy's or torch's generators: rounding coins and
noise come from the ``source`` argument (:func:`mechanisms.noise.secure_source`
when omitted); only the public rotation signs come from a seeded numpy
``Generator``.
"""

from __future__ import annotations

import math
import random

import numpy as np

from mechanisms.noise import (
    check_sigma,
    discrete_gaussian,
    secure_source,
    uniform_below,
)

#: Largest modulus: SecAgg+'s (``privfed.federation.secagg_masking.MAX_MODULUS``; ``mechanisms`` never imports privfed).
MAX_MODULUS = 2**32
#: Default per-try failure probability of conditional rounding (the paper's experiments' ``exp(-0.5)``).
DEFAULT_BETA = math.exp(-0.5)
#: Default tries before conditional rounding gives up: at ``beta = exp(-0.5)`` all fail with probability ``e^-500``.
DEFAULT_MAX_TRIES = 1000
#: Default probability that some coordinate of the sum leaves the centred range (:func:`choose_scale`).
DEFAULT_WRAP_PROBABILITY = 1e-9
#: Relative slack on the input norm check: clipped vectors overshoot their bound by a few ulps.
NORM_SLACK = 1e-9

_COIN_BITS = 53
_MAX_EXACT_FLOAT = 2.0**53


def padded_dimension(dim: int) -> int:
    """The smallest power of two at least ``dim``: the Walsh-Hadamard transform's length."""
    if dim < 1:
        raise ValueError(f"a dimension must be at least 1, got {dim}")
    return 1 << (dim - 1).bit_length()


def rotation_signs(dim: int, *, seed: int) -> np.ndarray:
    """The public diagonal ``D``: ``dim`` signs in ``{-1, +1}`` from ``seed`` alone (same on every client)."""
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"a rotation seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng(int(seed)).integers(0, 2, size=dim).astype(np.float64) * 2.0 - 1.0


def walsh_hadamard(x: np.ndarray) -> np.ndarray:
    """``H x`` over the last axis (Sylvester order, unnormalised), in ``O(d log d)`` butterflies.

    Level ``h`` pairs entry ``j`` with ``j + h`` inside each block of ``2h``
    entries and replaces them by their sum and difference.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    if n != padded_dimension(n):
        raise ValueError(f"the Walsh-Hadamard transform needs a power-of-two length, got {n}")
    y = x.reshape(-1, n)
    h = 1
    while h < n:
        blocks = y.reshape(y.shape[0], n // (2 * h), 2, h)
        first, second = blocks[:, :, 0, :], blocks[:, :, 1, :]
        y = np.stack((first + second, first - second), axis=2).reshape(-1, n)
        h *= 2
    return y.reshape(x.shape)


def rotate(x: np.ndarray, *, seed: int) -> np.ndarray:
    """``H D x / sqrt(d')`` over the last axis, ``x`` zero-padded to ``d' = padded_dimension(d)``.

    Orthonormal: it keeps L2 norms and :func:`unrotate` inverts it. Takes one
    vector or a stack of rows (each rotated alike).
    """
    x = np.asarray(x, dtype=np.float64)
    dim = padded_dimension(x.shape[-1])
    padded = np.zeros(x.shape[:-1] + (dim,))
    padded[..., : x.shape[-1]] = x
    return walsh_hadamard(padded * rotation_signs(dim, seed=seed)) / math.sqrt(dim)


def unrotate(y: np.ndarray, *, seed: int) -> np.ndarray:
    """``D H y / sqrt(d')``, the inverse (and transpose) of :func:`rotate`; the padding stays."""
    y = np.asarray(y, dtype=np.float64)
    dim = y.shape[-1]
    return walsh_hadamard(y) * rotation_signs(dim, seed=seed) / math.sqrt(dim)


def rounded_norm_bound(norm: float, *, dim: int, beta: float = DEFAULT_BETA) -> float:
    """``Delta_2``: a bound, failing with probability at most ``beta``, on the norm of a rounded vector.

    ``norm`` bounds the vector before rounding and ``dim`` is its length (the
    padded one), both in integer units. See the module docstring for the
    derivation; the second term of the ``min`` holds always.
    """
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta!r}")
    if not (math.isfinite(norm) and norm >= 0) or dim < 1:
        raise ValueError(f"need a finite norm >= 0 and dim >= 1, got ({norm!r}, {dim!r})")
    root_d = math.sqrt(dim)
    likely = norm**2 + dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (norm + root_d / 2)
    return math.sqrt(min(likely, (norm + root_d) ** 2))


def squared_norm(z: np.ndarray) -> int:
    """``||z||_2^2`` of an integer vector, exactly (Python integers when int64 could overflow)."""
    z = np.asarray(z, dtype=np.int64)
    largest = int(np.abs(z).max()) if z.size else 0
    if largest < 2**31 and z.size * largest * largest < 2**63:
        return int(np.dot(z, z))
    return sum(int(v) * int(v) for v in z)


def randomized_round(x: np.ndarray, *, source: random.Random) -> np.ndarray:
    """Each coordinate to its floor, or its ceiling with probability its fractional part: unbiased.

    A coin is a uniform 53-bit integer against the fractional part times
    ``2**53`` (an exact float), so each probability is high by less than ``2**-53``.
    """
    floor = np.floor(x)
    coins = uniform_below(np.full(x.shape[0], 2**_COIN_BITS, dtype=np.int64), source=source)
    return floor.astype(np.int64) + (coins < (x - floor) * 2.0**_COIN_BITS)


def conditional_randomized_round(
    x: np.ndarray,
    *,
    norm_bound: float,
    source: random.Random | None = None,
    max_tries: int = DEFAULT_MAX_TRIES,
) -> np.ndarray:
    """:func:`randomized_round` of a vector, redrawn until its L2 norm is at most ``norm_bound``.

    The check is on the exact integer ``||z||^2 <= floor(norm_bound^2)``, so
    the bound holds for every returned vector.

    Raises:
        ValueError: ``x`` is not a finite vector below ``2**53`` in magnitude.
        RuntimeError: ``max_tries`` draws all exceeded the bound.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or not np.isfinite(x).all() or (x.size and np.abs(x).max() >= _MAX_EXACT_FLOAT):
        raise ValueError("conditional rounding takes a finite vector with entries below 2**53 in magnitude")
    if max_tries < 1:
        raise ValueError(f"max_tries must be at least 1, got {max_tries}")
    source = secure_source() if source is None else source
    limit = math.floor(norm_bound**2) if math.isfinite(norm_bound) else None
    for _ in range(max_tries):
        z = randomized_round(x, source=source)
        if limit is None or squared_norm(z) <= limit:
            return z
    raise RuntimeError(
        f"conditional rounding: {max_tries} tries all exceeded the norm bound {norm_bound:.6g} "
        f"(the vector's own norm is {float(np.linalg.norm(x)):.6g})"
    )


def check_modulus(modulus: int) -> None:
    """Refuses a modulus SecAgg+'s int64 sums cannot take."""
    if not (isinstance(modulus, (int, np.integer)) and 2 <= modulus <= MAX_MODULUS):
        raise ValueError(f"the modulus must be an integer in [2, 2**32], got {modulus!r}")


def _check_scale(scale: float) -> None:
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"the scale gamma must be positive and finite, got {scale!r}")


def client_share(
    x: np.ndarray,
    *,
    scale: float,
    norm_bound: float,
    sigma_share: float,
    modulus: int,
    rotation_seed: int,
    beta: float = DEFAULT_BETA,
    max_tries: int = DEFAULT_MAX_TRIES,
    source: random.Random | None = None,
) -> np.ndarray:
    """One client's encoded vector: scale, rotate, round conditionally, add its noise share, reduce mod ``m``.

    Args:
        x: The client's vector (a table flattened), already clipped to ``norm_bound``.
        scale: ``gamma``, data units per integer step.
        norm_bound: ``c``, the L2 bound on ``x`` in data units; rounding is held to
            ``rounded_norm_bound(c / gamma, dim=padded_dimension(len(x)), beta=beta)``.
        sigma_share: The noise share's discrete-Gaussian scale, in integer units.
        modulus: ``m``, SecAgg+'s modulus.
        rotation_seed: The public seed every client of the sum uses.
        beta: Per-try failure probability the rounding bound is set for.
        max_tries: Rounding draws before giving up.
        source: Randomness for the coins and the noise; the OS CSPRNG if omitted.

    Returns:
        ``int64`` vector of length ``padded_dimension(len(x))``, entries in ``[0, m)``.

    Raises:
        ValueError: ``||x||`` exceeds ``norm_bound`` (beyond a ``1e-9`` relative slack) or
            a parameter is out of range.
    """
    check_modulus(modulus)
    _check_scale(scale)
    check_sigma(sigma_share)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"client_share takes one non-empty vector (flatten a table first), got shape {x.shape}")
    norm = float(np.linalg.norm(x))
    if not norm <= norm_bound * (1 + NORM_SLACK):
        raise ValueError(f"the vector's norm {norm:.6g} exceeds its bound {norm_bound:.6g}: clip it first")
    source = secure_source() if source is None else source
    dim = padded_dimension(x.size)
    bound = rounded_norm_bound(norm_bound / scale, dim=dim, beta=beta)
    rounded = conditional_randomized_round(
        rotate(x / scale, seed=rotation_seed), norm_bound=bound, source=source, max_tries=max_tries
    )
    return np.mod(rounded + discrete_gaussian(dim, sigma=sigma_share, source=source), modulus)


def centred_residue(values: np.ndarray, modulus: int) -> np.ndarray:
    """Each value's residue mod ``m`` in ``[-floor(m/2), m - 1 - floor(m/2)]``, i.e. ``[-m/2, m/2)`` for even ``m``."""
    check_modulus(modulus)
    half = modulus // 2
    return np.mod(np.mod(np.asarray(values, dtype=np.int64), modulus) + half, modulus) - half


def decode_sum(total: np.ndarray, *, modulus: int, scale: float, rotation_seed: int, dim: int) -> np.ndarray:
    """The sum of the clients' vectors, in data units, from the modular sum of their shares.

    Centres the sum, unrotates it, multiplies by ``gamma`` and drops the
    padding. Correct when every coordinate of the true integer sum lies in
    the centred range (what :func:`choose_scale` sizes ``gamma`` for).
    """
    _check_scale(scale)
    total = np.asarray(total)
    if total.ndim != 1 or total.shape[0] != padded_dimension(dim) or not np.issubdtype(total.dtype, np.integer):
        expected = padded_dimension(dim)
        raise ValueError(f"expected an integer vector of length {expected}, got {total.dtype} {total.shape}")
    centred = centred_residue(total, modulus).astype(np.float64)
    return unrotate(centred, seed=rotation_seed)[:dim] * scale


def wrap_tail_stds(dim: int, wrap_probability: float) -> float:
    """``k`` with ``2 d' exp(-k^2 / 2) = p``: a union bound over ``d'`` subgaussian coordinates."""
    if not 0 < wrap_probability < 1:
        raise ValueError(f"wrap_probability must be in (0, 1), got {wrap_probability!r}")
    return math.sqrt(2 * math.log(2 * padded_dimension(dim) / wrap_probability))


def choose_scale(
    *,
    norm_bound: float,
    dim: int,
    modulus: int,
    max_clients: int,
    share_std: float,
    wrap_probability: float = DEFAULT_WRAP_PROBABILITY,
) -> float:
    """The finest ``gamma`` at which the sum of up to ``max_clients`` shares stays in the centred range.

    With ``d' = padded_dimension(dim)``, ``K = max_clients`` and ``s = share_std``
    (one client's noise std in *data* units; the client then uses
    ``sigma_share = s / gamma``), each coordinate of the rotated integer sum is
    subgaussian with variance proxy

        tau^2 = ((K c)^2 / d' + K s^2) / gamma^2 + K / 4:

    the signal, at most ``K c`` in norm, spread by the random signs; the
    rounding errors, each zero-mean in an interval of length 1; the noise
    shares (a discrete Gaussian of scale ``sigma`` is ``sigma``-subgaussian,
    Canonne, Kamath and Steinke 2020). ``gamma`` is the smallest with
    ``k tau <= floor((m - 1) / 2)``, ``k`` from :func:`wrap_tail_stds`, so no
    coordinate wraps with probability ``1 - wrap_probability`` (ignoring
    conditional rounding's slight bias, and assuming the data do not depend
    on the rotation seed). Size ``K`` as the most clients that can be summed
    and ``s`` as the target noise std over ``sqrt(K_min)``.

    Raises:
        ValueError: no ``gamma`` fits: ``K`` rounding errors alone overflow ``m``,
            or the fitting ``gamma`` exceeds ``c`` (a whole vector below one step).
    """
    check_modulus(modulus)
    if max_clients < 1 or not (norm_bound > 0 and share_std >= 0):
        raise ValueError(
            f"need max_clients >= 1, norm_bound > 0 and share_std >= 0, got ({max_clients}, {norm_bound}, {share_std})"
        )
    stds = wrap_tail_stds(dim, wrap_probability)
    room = ((modulus - 1) // 2 / stds) ** 2 - max_clients / 4
    if room <= 0:
        raise ValueError(
            f"modulus {modulus} cannot hold {max_clients} clients' rounding errors at {stds:.3g} standard deviations: "
            f"raise the modulus or lower max_clients"
        )
    spread = (max_clients * norm_bound) ** 2 / padded_dimension(dim) + max_clients * share_std**2
    scale = math.sqrt(spread / room)
    if scale > norm_bound:
        raise ValueError(
            f"modulus {modulus} fits {max_clients} clients only at gamma {scale:.3g}, coarser than the norm bound "
            f"{norm_bound:.3g}: a whole vector would round to less than one step; raise the modulus"
        )
    return scale
