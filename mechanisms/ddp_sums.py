"""Distributed DP per-cell sums: each client's noisy *share* of the ``ldp-sums`` table, for a secure sum.

``ldp-sums`` has every client add the whole noise to its own table. Here a
client adds only a share, and the server sees the tables only through their
sum under SecAgg+ (Kairouz, Liu and Steinke, ICML 2021: the distributed
discrete Gaussian). With at least ``K_min`` shares in the sum, its noise is
what one ``ldp-sums`` release carries, so each client pays the same privacy
for noise ``sqrt(K)`` times smaller per client in the sum.

One client, one round (the server's previous global centroids are the cells):

1. Clip each row to the unit ball and round it to ``ldp-sums``'s integer grid
   (:func:`mechanisms.ldp_sums.sums_grid`), rows of a secret Poisson sample
   only when ``sampling_rate`` < 1 (coins from the OS CSPRNG). Rounding is per
   row and deterministic, so a replaced row moves the integer table by at most
   the row bound of :mod:`mechanisms.ldp_sums` (``2 s``; a sampled row's
   presence by ``Delta = sqrt(s^2 + res^2)``), exactly as there. No random
   rotation or randomised rounding is needed: every entry is an integer bounded
   by the rows' count, so the sum fits the modulus (:func:`check_fits_modulus`).
2. Add discrete Gaussian noise of scale ``sigma_share = z * unit / sqrt(K_min)``
   (grid units) to every entry, ``z`` the release's noise multiplier, and
   reduce mod ``m``: :func:`table_share`.
3. The server decodes the modular sum (:func:`decode_table`): the summed table
   plus the sum of the shares.

Privacy against a server that sees only the sum. Replacing one row of one
client moves the summed table by what it moves that client's table; the sum
of ``K >= K_min`` independent discrete Gaussians of scale ``sigma_share`` is
close to one of variance ``K sigma_share^2 >= (z * unit)^2``: Kairouz et al.
(Prop. 14) bound its Renyi divergence by the Gaussian's plus ``tau * d``
terms, ``tau = 10 sum_{k=1}^{K-1} exp(-2 pi^2 sigma_share^2 k / (k + 1))``.
:data:`MIN_SHARE_SIGMA` keeps ``tau * d`` far below double precision, so the
release is accounted as ``ldp-sums``'s (``"gaussian"``, or
``"poisson_gaussian"`` with the sample): the continuous-Gaussian approximation
:mod:`mechanisms.accounting` states once. The charge assumes at least
``K_min`` honest clients' shares in every sum; fewer, or a server that also
sees some shares (colluding clients), leaves less noise than accounted.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mechanisms.base import DIFFERENTIAL_PRIVACY, Guarantee, PrivacyEvent, SecureSumMechanism, replace_one_dp_guarantee
from mechanisms.dp_pieces import MAX_DIMENSION, clip_to_radius
from mechanisms.ldp_sums import (
    SECRET_SAMPLE_SETTINGS,
    THRESHOLD_STDS,
    LdpSumsMechanism,
    count_scale,
    integer_table,
    nearest_cells,
    row_bound,
    secret_sample_options,
    sums_grid,
    table_in_data_units,
)
from mechanisms.noise import discrete_gaussian, poisson_sample_mask, secure_source
from mechanisms.planning import PlanRequest
from mechanisms.registry import register_mechanism

#: Largest modulus: SecAgg+'s (``privfed.secagg.masking.MAX_MODULUS``; ``mechanisms`` never imports privfed).
MAX_MODULUS = 2**32
#: Smallest per-client noise scale, in grid units: ``tau * d`` of Kairouz et al. is then below ``1e-30``.
MIN_SHARE_SIGMA = 3.0
#: How many standard deviations of the summed noise the modulus leaves room for (:func:`check_fits_modulus`).
NOISE_TAIL_STDS = 20.0


def check_modulus(modulus: int) -> None:
    """Refuses a modulus SecAgg+'s int64 sums cannot take."""
    if not (isinstance(modulus, (int, np.integer)) and 2 <= modulus <= MAX_MODULUS):
        raise ValueError(f"the modulus must be an integer in [2, 2**32], got {modulus!r}")


def centred_residue(values: np.ndarray, modulus: int) -> np.ndarray:
    """Each value's residue mod ``m`` in ``[-floor(m/2), m - 1 - floor(m/2)]``: the true sum when it lies there."""
    check_modulus(modulus)
    half = modulus // 2
    return np.mod(np.mod(np.asarray(values, dtype=np.int64), modulus) + half, modulus) - half


def share_sigma(noise_multiplier: float, *, min_shares: int, dim: int, sampled: bool) -> float:
    """One client's noise scale, in grid units: ``K_min`` shares make the release's ``z * unit``.

    Raises:
        ValueError: the share falls below :data:`MIN_SHARE_SIGMA` (the sum of
            shares would stray from a discrete Gaussian), or ``min_shares < 1``.
    """
    if min_shares < 1:
        raise ValueError(f"min_shares must be at least 1, got {min_shares}")
    sigma = noise_multiplier * row_bound(sums_grid(dim), sampled=sampled) / math.sqrt(min_shares)
    if not sigma >= MIN_SHARE_SIGMA:
        raise ValueError(
            f"a noise share of {sigma:.3g} grid units is below {MIN_SHARE_SIGMA}: the sum of {min_shares} shares "
            "would not be close to a discrete Gaussian (raise the noise or lower min_shares)"
        )
    return sigma


def check_fits_modulus(
    *, modulus: int, num_cells: int, dim: int, max_clients: int, max_rows: int, noise_multiplier: float, sampled: bool
) -> None:
    """Refuses a modulus the sum of ``max_clients`` tables of ``max_rows`` rows each, plus noise, could wrap.

    An entry of one table is at most ``max_rows * res`` in magnitude (a count)
    or ``max_rows * (res + 1/2)`` (a sum coordinate of unit rows); the summed
    noise is given :data:`NOISE_TAIL_STDS` of its largest std (every client's
    share, ``max_clients`` of them).
    """
    check_modulus(modulus)
    grid = sums_grid(dim)
    signal = max_clients * max_rows * (count_scale(grid) + 0.5)
    share = noise_multiplier * row_bound(grid, sampled=sampled)  # K_min = 1: the largest share
    noise = NOISE_TAIL_STDS * share * math.sqrt(max_clients)
    if signal + noise >= modulus // 2:
        raise ValueError(
            f"the sum of {max_clients} tables of {num_cells} x {dim + 1} entries ({max_rows} rows each) can reach "
            f"{signal + noise:.3g}, beyond the modulus's half {modulus // 2}"
        )


def table_share(
    reps: torch.Tensor,
    centres: torch.Tensor,
    *,
    noise_multiplier: float,
    min_shares: int,
    modulus: int,
    sampling_rate: float = 1.0,
    source: random.Random | None = None,
) -> np.ndarray:
    """One client's share: its integer table (rows to their nearest centre's cell) plus noise, flattened, mod ``m``.

    Args:
        reps: ``[n, D]`` the client's representations (every image's, when sampled).
        centres: ``[G, D]`` the public partition (the previous global centroids).
        noise_multiplier: ``z``: the summed noise's std over the row bound.
        min_shares: ``K_min``: the fewest shares every sum holds.
        modulus: ``m``, SecAgg+'s.
        sampling_rate: The secret Poisson sample's rate (1: every row).
        source: Randomness for the coins and the noise; the OS CSPRNG if omitted.

    Returns:
        ``int64`` ``[G * (D + 1)]`` in ``[0, m)``: the cells' sums, each followed by its count.
    """
    check_modulus(modulus)
    n, dim = reps.shape
    source = secure_source() if source is None else source
    sampled = sampling_rate < 1
    sigma = share_sigma(noise_multiplier, min_shares=min_shares, dim=dim, sampled=sampled)
    kept = poisson_sample_mask(n, sampling_rate, source=source) if sampled else None
    x = clip_to_radius(reps.detach().double().cpu(), 1.0)
    table = integer_table(x, nearest_cells(x, centres.detach().double().cpu()), centres.shape[0], kept=kept)
    return noisy_share(table.ravel(), sigma=sigma, modulus=modulus, source=source)


def noisy_share(table: np.ndarray, *, sigma: float, modulus: int, source: random.Random) -> np.ndarray:
    """``table`` plus discrete Gaussian noise of scale ``sigma`` per entry, mod ``m``: what enters the secure sum."""
    return np.mod(table + discrete_gaussian(table.size, sigma=sigma, source=source), modulus)


def decode_table(total: np.ndarray, *, num_cells: int, dim: int, modulus: int) -> tuple[np.ndarray, torch.Tensor]:
    """Noisy summed counts ``[G]`` and sums ``[G, D]``, in data units, from the modular sum of the shares.

    Correct when every entry of the true sum (tables and noise) lies in
    ``[-m/2, m/2)``, which :func:`check_fits_modulus` sizes for.
    """
    total = np.asarray(total)
    if total.shape != (num_cells * (dim + 1),) or not np.issubdtype(total.dtype, np.integer):
        raise ValueError(f"expected {num_cells * (dim + 1)} integers, got {total.dtype} {total.shape}")
    return table_in_data_units(centred_residue(total, modulus).reshape(num_cells, dim + 1))


def lloyd_step(
    previous: torch.Tensor, counts: np.ndarray, sums: torch.Tensor, *, threshold: float, momentum: float = 0.0
) -> torch.Tensor:
    """New global centroids: each cell whose noisy count reaches ``threshold`` moves towards its normalised noisy sum.

    A moved cell becomes ``normalise(momentum * previous + (1 - momentum) * step)``:
    a server EMA that averages the noise of successive rounds. The others keep
    their previous value (post-processing: only public and noisy values are read).
    """
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    before = previous.detach().double()
    moved = torch.from_numpy(counts >= threshold) & (sums.norm(dim=1) > 0)
    updated = before.clone()
    step = F.normalize(sums[moved], dim=1)
    updated[moved] = F.normalize(momentum * before[moved] + (1.0 - momentum) * step, dim=1)
    return updated.to(previous.dtype)


#: The protocol's modulus the shares are reduced by (SecAgg+'s largest).
DEFAULT_MODULUS = MAX_MODULUS
#: The server's EMA over rounds of each moved centroid (:func:`lloyd_step`).
DEFAULT_MOMENTUM = 0.5


@register_mechanism
class DdpSumsMechanism(SecureSumMechanism):
    """``ldp-sums``'s table with the noise split over the clients of a secure sum.

    Each client's :meth:`share` is its table plus ``1/sqrt(K_min)`` of the
    noise; :meth:`combine` decodes the sum and takes one Lloyd step. A client
    is charged exactly ``ldp-sums``'s event at the same multiplier, so the
    calibration is ``ldp-sums``'s.
    """

    name = "ddp-sums"
    description = "per-cell sums and counts summed under SecAgg+, each client adding a discrete Gaussian share"
    guarantee_kind = DIFFERENTIAL_PRIVACY
    settings = SECRET_SAMPLE_SETTINGS

    @classmethod
    def calibration_options(cls, request: PlanRequest, settings: Mapping[str, Any]) -> dict[str, Any]:
        return secret_sample_options(request, settings)

    @classmethod
    def calibrate(
        cls, *, epsilon: float, delta: float, num_releases: int, sampling_rate: float = 1.0
    ) -> dict[str, float]:
        """``ldp-sums``'s multiplier: the summed noise of ``K_min`` shares is one ``ldp-sums`` release's."""
        return LdpSumsMechanism.calibrate(
            epsilon=epsilon, delta=delta, num_releases=num_releases, sampling_rate=sampling_rate
        )

    def __init__(
        self,
        *,
        noise_multiplier: float,
        delta: float,
        sampling_rate: float = 1.0,
        min_shares: int = 1,
        modulus: int = DEFAULT_MODULUS,
        momentum: float = DEFAULT_MOMENTUM,
        noise_source: random.Random | None = None,
    ) -> None:
        """Builds one client's (or the server's) view of a calibrated run.

        Args:
            noise_multiplier: ``z``, the summed noise's std over the row bound.
            delta: Delta of each release's epsilon.
            sampling_rate: The secret sample's rate (1: every row).
            min_shares: ``K_min``: the fewest shares in any sum (SecAgg+'s threshold or more).
            modulus: SecAgg+'s modulus.
            momentum: The server's EMA of moved centroids (post-processing; :func:`lloyd_step`).
            noise_source: Randomness for coins and noise; leave unset (the OS CSPRNG).
        """
        check_modulus(modulus)
        self.local = LdpSumsMechanism(noise_multiplier=noise_multiplier, delta=delta, sampling_rate=sampling_rate)
        self.min_shares = int(min_shares)
        self.modulus = int(modulus)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = float(momentum)
        self.noise_source = noise_source
        self.centres: torch.Tensor | None = None
        for dim in (1, MAX_DIMENSION):  # refuse a share the sum of shares could not stand for, before any round
            share_sigma(noise_multiplier, min_shares=self.min_shares, dim=dim, sampled=sampling_rate < 1)

    def observe_global_centroids(self, centroids: torch.Tensor) -> None:
        """The previous global centroids: every client's cells (the sum needs the same partition everywhere)."""
        self.centres = centroids.detach().double().cpu()

    @property
    def input_sampling_rate(self) -> float:
        return self.local.sampling_rate

    def privacy_events(self) -> tuple[PrivacyEvent, ...]:
        """What ``ldp-sums`` charges at the same multiplier and rate."""
        return self.local.privacy_events()

    def guarantee(self, *, num_reps: int, num_centroids: int) -> Guarantee:
        return replace_one_dp_guarantee(
            self.local.epsilon, self.local.delta,
            accounting=f"ldp-sums's Gaussian, for the noise of at least {self.min_shares} shares in each secure sum",
            covers="what the server learns from the secure sum",
        )

    def share(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> np.ndarray:
        """This client's table plus its noise share, flattened, mod ``m``; the cells are the observed centroids."""
        if self.centres is None:
            raise ValueError("ddp-sums needs the global centroids every client partitions by (round 0 included)")
        return table_share(
            reps, self.centres, noise_multiplier=self.local.noise_multiplier, min_shares=self.min_shares,
            modulus=self.modulus, sampling_rate=self.local.sampling_rate, source=self.noise_source,
        )

    def share_length(self, *, num_cells: int, dim: int) -> int:
        """A sum and a count per cell."""
        return num_cells * (dim + 1)

    def check_secure_sum(self, *, threshold: int, modulus: int) -> None:
        """Refuses a sum that may hold fewer than ``K_min`` shares, or reduces by another modulus than the shares'."""
        if threshold < self.min_shares:
            raise ValueError(
                f"SecAgg+'s threshold {threshold} lets a sum hold fewer than the {self.min_shares} shares its noise needs"
            )
        if modulus != self.modulus:
            raise ValueError(f"SecAgg+ sums mod {modulus}, the shares are reduced mod {self.modulus}")

    def check_sum_capacity(self, *, max_summed: int, max_rows: int, num_cells: int, dim: int) -> None:
        """:func:`check_fits_modulus` for this run's shares."""
        check_fits_modulus(
            modulus=self.modulus, num_cells=num_cells, dim=dim, max_clients=max_summed, max_rows=max_rows,
            noise_multiplier=self.local.noise_multiplier, sampled=self.local.sampling_rate < 1,
        )

    def combine(self, total: np.ndarray, *, centroids: torch.Tensor, num_summed: int) -> torch.Tensor:
        """One Lloyd step from the summed tables: a cell moves when its noisy count passes 3 stds of the summed noise."""
        if num_summed < self.min_shares:
            raise ValueError(f"a sum of {num_summed} shares holds less noise than the {self.min_shares} accounted")
        dim = centroids.shape[1]
        counts, sums = decode_table(total, num_cells=centroids.shape[0], dim=dim, modulus=self.modulus)
        sampled = self.local.sampling_rate < 1
        sigma = share_sigma(self.local.noise_multiplier, min_shares=self.min_shares, dim=dim, sampled=sampled)
        count_std = sigma * math.sqrt(num_summed) / count_scale(sums_grid(dim))
        threshold = max(THRESHOLD_STDS * count_std, 1.0)
        return lloyd_step(centroids, counts, sums, threshold=threshold, momentum=self.momentum)
