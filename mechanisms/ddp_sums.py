"""Distributed DP per-cell sums: each client's noisy *share* of the ``ldp-sums`` table, for a secure sum.

``ldp-sums`` has every client add the whole noise to its own table. Here a
client adds only a share, and the server sees the tables only through their
sum under SecAgg+ (Kairouz, Liu and Steinke, ICML 2021: the distributed
discrete Gaussian). With at least ``K_min`` shares in the sum, its noise is
what one ``ldp-sums`` release carries: each client pays the same privacy for
noise ``sqrt(K)`` times smaller per client in the sum. One client, one round:

1. The integer table of :mod:`mechanisms.ldp_sums` (same clipping, grid,
   cells: the previous global centroids, and secret sample), whose
   sensitivity argument holds unchanged: rounding is per row and
   deterministic, so a replaced row moves it by at most ``2s`` (a sampled
   row's presence by ``Delta``). Its entries are integers bounded by the rows'
   count, so no random rotation or randomised rounding is needed and the sum
   fits the modulus (:func:`check_fits_modulus`).
2. Discrete Gaussian noise of scale ``sigma_share = z * unit / sqrt(K_min)``
   (grid units, ``z`` the release's multiplier) on every entry, mod ``m``:
   :func:`table_share`. The server decodes the modular sum (:func:`decode_table`).

Privacy against a server that sees only the sum: replacing one row of one
client moves the sum as it moves that client's table, and the sum of
``K >= K_min`` independent shares is close to one discrete Gaussian of
variance ``K sigma_share^2 >= (z * unit)^2``, within Kairouz et al.'s
(Prop. 14) ``tau * d`` Renyi term, which :data:`MIN_SHARE_SIGMA` keeps far
below double precision (docs/privacy.md, "Distributed DP (ddp-sums)"). So a
release is accounted as ``ldp-sums``'s (``"gaussian"``, or
``"poisson_gaussian"`` with the sample), with the continuous-Gaussian
approximation :mod:`mechanisms.accounting` states. Trust assumption: at least
``K_min`` honest clients' shares in every sum; fewer, or a server that also
sees some shares (colluding clients), leaves less noise than accounted.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
import torch.nn.functional as F

from mechanisms.base import Guarantee, PrivacyEvent, SecureSumMechanism, replace_one_dp_guarantee
from mechanisms.dp_pieces import MAX_DIMENSION, clip_to_radius
from mechanisms.ldp_sums import (
    DEFAULT_MOMENTUM,
    NOISE_TAIL_STDS,
    LdpSumsMechanism,
    TableCalibration,
    check_momentum,
    count_scale,
    integer_table,
    nearest_cells,
    row_bound,
    step_threshold,
    summed_count_std,
    summed_table_step,
    sums_grid,
    table_in_data_units,
)
from mechanisms.noise import discrete_gaussian, poisson_sample_mask, secure_source
from mechanisms.registry import register_mechanism

#: Largest modulus, and the shares' default: SecAgg+'s (``privfed.secagg.masking.MAX_MODULUS``; ``mechanisms``
#: never imports privfed).
MAX_MODULUS = 2**32
#: Smallest per-client noise scale, in grid units: ``tau * d`` of Kairouz et al. is then below ``1e-30``.
MIN_SHARE_SIGMA = 3.0


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
    """One client's noise scale, in grid units: ``K_min`` shares make the release's ``z * unit``; refuses (ValueError)
    one below :data:`MIN_SHARE_SIGMA` (the sum would stray from a discrete Gaussian), or ``min_shares < 1``."""
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
    """Refuses a modulus the sum of ``max_clients`` tables of ``max_rows`` rows each (entries at most
    ``max_rows * (res + 1/2)``), plus :data:`NOISE_TAIL_STDS` of the summed noise's largest std, could wrap."""
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
    reps: torch.Tensor, centres: torch.Tensor, *, noise_multiplier: float, min_shares: int, modulus: int,
    sampling_rate: float = 1.0, source: random.Random | None = None,
) -> np.ndarray:
    """One client's share, ``int64`` ``[G * (D + 1)]`` in ``[0, m)``: its table over the cells of ``centres``
    (each cell's sum followed by its count) plus noise, mod ``m``."""
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


def decoded_integer_table(total: np.ndarray, *, num_cells: int, dim: int, modulus: int) -> np.ndarray:
    """The summed ``[G, D + 1]`` table in grid units from the modular sum of the shares: correct when every entry of
    the true sum lies in ``[-m/2, m/2)``, which :func:`check_fits_modulus` sizes for."""
    total = np.asarray(total)
    if total.shape != (num_cells * (dim + 1),) or not np.issubdtype(total.dtype, np.integer):
        raise ValueError(f"expected {num_cells * (dim + 1)} integers, got {total.dtype} {total.shape}")
    return centred_residue(total, modulus).reshape(num_cells, dim + 1)


def decode_table(total: np.ndarray, *, num_cells: int, dim: int, modulus: int) -> tuple[np.ndarray, torch.Tensor]:
    """Noisy summed counts ``[G]`` and sums ``[G, D]``, in data units (:func:`decoded_integer_table`)."""
    return table_in_data_units(decoded_integer_table(total, num_cells=num_cells, dim=dim, modulus=modulus))


@register_mechanism
class DdpSumsMechanism(TableCalibration, SecureSumMechanism):
    """``ldp-sums``'s table with the noise split over the clients of a secure sum: each :meth:`share` adds noise of
    ``1/sqrt(K_min)`` the release's scale, and :meth:`combine` takes one Lloyd step from the decoded sum."""

    name = "ddp-sums"
    description = "per-cell sums and counts summed under SecAgg+, each client adding a discrete Gaussian share"

    def __init__(
        self,
        *,
        noise_multiplier: float,
        delta: float,
        sampling_rate: float = 1.0,
        min_shares: int = 1,
        modulus: int = MAX_MODULUS,
        momentum: float = DEFAULT_MOMENTUM,
        noise_source: random.Random | None = None,
    ) -> None:
        """One client's (or the server's) view of a calibrated run.

        ``noise_multiplier`` ``z`` is the summed noise's std over the row bound, ``min_shares`` ``K_min`` the
        fewest shares in any sum, ``momentum`` the server's EMA (:func:`~mechanisms.ldp_sums.lloyd_step`); leave ``noise_source`` unset.
        """
        check_modulus(modulus)
        self.local = LdpSumsMechanism(noise_multiplier=noise_multiplier, delta=delta, sampling_rate=sampling_rate)
        self.min_shares = int(min_shares)
        self.modulus = int(modulus)
        self.momentum = check_momentum(momentum)
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

    def decode(self, total: np.ndarray, *, num_cells: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The summed table as :meth:`combine` reads it: ``[G, D]`` unit noisy per-cell sums (zero for a zero sum) and
        ``[G]`` noisy counts, float64, in data units (:func:`decode_table`)."""
        counts, sums = decode_table(total, num_cells=num_cells, dim=dim, modulus=self.modulus)
        return F.normalize(sums, dim=1), torch.from_numpy(counts)

    def combine(self, total: np.ndarray, *, centroids: torch.Tensor, num_summed: int) -> torch.Tensor:
        """One Lloyd step from the summed tables (:func:`~mechanisms.ldp_sums.summed_table_step`, as ``ldp-sums``'s
        server takes it): a cell moves when its noisy count passes one std of the summed count noise."""
        if num_summed < self.min_shares:
            raise ValueError(f"a sum of {num_summed} shares holds less noise than the {self.min_shares} accounted")
        num_cells, dim = centroids.shape
        table = decoded_integer_table(total, num_cells=num_cells, dim=dim, modulus=self.modulus)
        count_std = summed_count_std(
            self.local.noise_multiplier, dim=dim, sampled=self.local.sampling_rate < 1,
            releases_summed=num_summed / self.min_shares,
        )
        return summed_table_step(centroids, table, count_std=count_std, momentum=self.momentum)

    def move_threshold(self, *, dim: int, num_summed: int) -> float:
        """The noisy count a cell needs to move (public): :func:`step_threshold` of a sum of ``num_summed`` shares."""
        count_std = summed_count_std(
            self.local.noise_multiplier, dim=dim, sampled=self.local.sampling_rate < 1,
            releases_summed=num_summed / self.min_shares,
        )
        return step_threshold(count_std)
