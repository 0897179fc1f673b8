"""Differentially private per-cell sums over a public partition: the ``ldp-sums`` mechanism.

``ldp`` spends much of its budget finding clusters and still mixes them.
Here the partition is public: each row goes to the cell of its nearest
partition centre, and one Gaussian on the whole table of per-cell sums and
counts pays for everything.

1. Clip every row to the unit ball and round it to an integer grid of
   ``res = ceil(50 sqrt(D))`` steps per unit.
2. Assign it to the nearest partition centre (largest inner product): the
   previous global centroids when the server sent them (public), else ``L``
   random unit vectors from the release's ``generator`` (public and
   data-independent: the server knows its seed). Round 0 thus releases noisy
   sums over a random partition, which still keeps most of a cluster in one
   cell; its charge is planned either way.
3. Per cell ``c``: the integer sum ``S_c`` of its rounded rows and the count
   ``res * n_c``. Every entry, empty cells included, gets discrete Gaussian
   noise of one sigma from the OS CSPRNG (:mod:`mechanisms.noise`).
4. The noisy table is the release (:class:`~mechanisms.base.TableRelease`).
   The server adds a training round's tables, all over the same public
   cells, and moves each cell whose summed noisy count passes one std of the
   summed count noise to its summed direction (:func:`summed_table_step`,
   the step ``ddp-sums`` takes after its secure sum). Round 0's cells are
   each client's own; the server clusters their view: of the cells whose
   noisy count reaches the public threshold (default
   ``max(3 * count noise std, 1)``), the ``L`` with the largest noisy counts,
   as unit noisy sums weighted by their noisy counts. All of this is
   post-processing of the noisy table.

Sensitivity (replace-one, the unit of :mod:`mechanisms.accounting`): a
rounded row has ``||r||_2 <= s = res + sqrt(D)/2`` grid steps, its count
entry is ``res <= s``. Replacing row ``x`` (cell ``a``) by ``y`` (cell ``b``)
moves the table by ``sqrt(||r_x||^2 + ||r_y||^2 + 2 res^2) <= 2s`` when
``a != b`` (two sums, two counts), by ``||r_y - r_x|| <= 2s`` when ``a == b``.
So the table has L2 sensitivity ``2s``: one Gaussian of multiplier
``z = sigma / s``, a ``"gaussian"`` event that
:func:`mechanisms.accounting.replace_one_pld` accounts with replace-one's
shift of twice the per-row bound (measured in ``tests/mechanisms/test_ldp_sums.py``).

Secret sample (``sampling_rate`` q < 1): each row is kept with probability q
by coins from the noise source (the OS CSPRNG), never the round's
``generator``. A kept row moves the table by at most
``Delta = sqrt(s^2 + res^2) <= sqrt(2) s``, so ``sigma = z * Delta``, charged
as a ``"poisson_gaussian"`` event of rate q and multiplier z. A dropped row is
added as zeros, so neither the table nor the timing shows the sample's size
(docs/privacy.md, "The secret sample (ldp-sums)").

Each sum coordinate and count carries noise of std ``z * s / res <= 1.01 z``
in data units (sampled: ``<= 1.43 z``, which the default threshold follows).
The discrete Gaussian is accounted as the continuous one, the approximation
:mod:`mechanisms.accounting` states. The centres and the table's shape are
public, and the bound holds for any centres, a hostile server's too (a row's
cell depends on that row and the centres alone). A client with zero rows runs
the same code. The guarantee covers the released table and what is computed
from it (vectors, weights, metrics), not the encoder update.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from functools import lru_cache
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from dp_accounting import gaussian_mechanism

from mechanisms import accounting
from mechanisms.base import (
    DIFFERENTIAL_PRIVACY,
    Guarantee,
    Mechanism,
    PrivacyEvent,
    TableRelease,
    TableReleaseMechanism,
    replace_one_dp_guarantee,
)
from mechanisms.dp_pieces import (
    DEFAULT_DELTA,
    DEFAULT_EPSILON,
    MAX_DIMENSION,
    WEIGHT_NOISE_SCALES,
    Grid,
    clip_to_radius,
)
from mechanisms.noise import check_sigma, discrete_gaussian, poisson_sample_mask, secure_source
from mechanisms.planning import PlanRequest
from mechanisms.registry import register_mechanism

#: How many count-noise standard deviations the default threshold asks of a released cell.
THRESHOLD_STDS = 3.0
#: How many count-noise stds a cell's summed count needs for the server's step to move it. Lower than a client's
#: threshold: on the CPU preset 1 std lifted ``ldp-sums`` over 3 at epsilon 1 in every seed and at epsilon 10 on
#: average, in 2 of 3 seeds (docs/privacy.md, "On the CPU preset"), and a noise-only cell that passes gets its noise
#: direction at weight ``1 - momentum``.
STEP_THRESHOLD_STDS = 1.0
#: How many noise stds an honest table's entries stay within (:meth:`LdpSumsMechanism.check_table`), and the
#: secure sum's modulus leaves room for (``mechanisms.ddp_sums.check_fits_modulus``).
NOISE_TAIL_STDS = 20.0
#: The server's EMA over rounds of each moved centroid (:func:`lloyd_step`): 0.75 beat 0.5 in 6 of the 8 synthetic
#: settings of ``benchmarks/dp_centroid_rounds.py`` and was within the spread in the other 2 (docs/privacy.md,
#: "The server's step, cadence and momentum").
DEFAULT_MOMENTUM = 0.75
#: Largest ratio of the count noise's std to the noise multiplier, over all dimensions (``s / res <= 1.01``), unsampled.
COUNT_STD_PER_MULTIPLIER = 1.01


def sums_grid(dim: int) -> Grid:
    """The integer grid: ``ceil(50 sqrt(D))`` steps per unit, so the count entry ``res`` is at most the row bound ``s``."""
    resolution = math.ceil(50.0 * math.sqrt(max(dim, 1)))
    return Grid.for_dimension(dim, 1.0, resolution=resolution)


def count_scale(grid: Grid) -> int:
    """Grid steps per counted row: one unit of data, i.e. the grid's resolution."""
    return round(1.0 / grid.step)


def row_bound(grid: Grid, *, sampled: bool) -> float:
    """The noise's unit, in grid steps: ``s`` against a replaced row; ``sqrt(s^2 + res^2)`` against a sampled row's absence."""
    return math.hypot(grid.sensitivity, count_scale(grid)) if sampled else grid.sensitivity


def table_event(noise_multiplier: float, *, count: int = 1, sampling_rate: float = 1.0) -> PrivacyEvent:
    """The ledger record of ``count`` releases: a Gaussian of ``noise_multiplier`` row bounds, on a Poisson sample if q < 1."""
    if sampling_rate < 1:
        return accounting.poisson_gaussian_privacy_event(sampling_rate, noise_multiplier, count=count)
    return PrivacyEvent("gaussian", {"noise_multiplier": float(noise_multiplier), "count": float(count)})


@lru_cache(maxsize=64)
def sums_noise_multiplier(epsilon: float, delta: float, *, num_releases: int, sampling_rate: float = 1.0) -> float:
    """Smallest multiplier whose ``num_releases`` releases fit ``(epsilon, delta)`` on the ledger's own PLD grid:
    unsampled, the analytic Gaussian calibration (Balle and Wang 2018), raised by 0.1 % steps until the
    ledger's PLD (rounding up by up to 1 % of ``epsilon``) agrees; sampled, a bisection on the ledger's PLD."""
    if epsilon <= 0 or not 0 < delta < 1 or num_releases < 1:
        raise ValueError(f"need epsilon > 0, 0 < delta < 1 and num_releases >= 1, got ({epsilon}, {delta}, {num_releases})")
    check_sampling_rate(sampling_rate)
    z = accounting.REPLACEMENT_SHIFT * float(gaussian_mechanism.get_sigma_gaussian(epsilon, delta)) * math.sqrt(num_releases)
    events = [table_event(z, count=num_releases, sampling_rate=sampling_rate)]
    grid = accounting.calibration_discretisation(epsilon, accounting.rounding_compositions(events))

    def fits(multiplier: float) -> bool:
        event = table_event(multiplier, count=num_releases, sampling_rate=sampling_rate)
        return accounting.epsilon_of([event], delta, discretisation=grid) <= epsilon

    if sampling_rate < 1:  # the guess: the unsampled noise, per sqrt(2) row bounds, scaled by the rate
        return accounting.smallest_fitting_multiplier(fits, sampling_rate * z / math.sqrt(2))
    while not fits(z):
        z *= 1.001
    return z


def check_sampling_rate(rate: float) -> None:
    """Refuses a secret sample's rate outside ``(0, 1]`` (1: no sample)."""
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and 0 < rate <= 1):
        raise ValueError(f"ldp-sums sampling_rate must be in (0, 1], got {rate!r}")


@lru_cache(maxsize=256)
def release_epsilon(noise_multiplier: float, delta: float) -> float:
    """Epsilon of one release at ``delta``: the Gaussian's exact value (Balle and Wang 2018), shift twice the row
    bound (the ledger's PLD rounds it up by at most its grid, and would need terabytes for a tiny multiplier)."""
    return float(gaussian_mechanism.get_epsilon_gaussian(noise_multiplier / accounting.REPLACEMENT_SHIFT, delta))


@lru_cache(maxsize=256)
def sampled_release_epsilon(noise_multiplier: float, delta: float, sampling_rate: float) -> float:
    """Epsilon of one sampled release at ``delta``, on the ledger's PLD (grid 1e-4: at most that much high)."""
    return accounting.epsilon_of([table_event(noise_multiplier, sampling_rate=sampling_rate)], delta)


def nearest_cells(x: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Index of each row's nearest centre by inner product (unit centres: by cosine)."""
    if x.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long)
    return (x @ F.normalize(centres.double(), dim=1).T).argmax(dim=1)


def cell_table(
    rounded: np.ndarray, cells: np.ndarray, num_cells: int, scale: int, *, kept: np.ndarray | None = None
) -> np.ndarray:
    """``[cells, D + 1]``: each cell's rounded sum, then ``scale`` times its count, of the ``kept`` rows (default
    all); a dropped row is added as zeros, so the time taken does not tell how many were kept."""
    weight = np.ones(len(cells), dtype=np.int64) if kept is None else kept.astype(np.int64)
    table = np.zeros((num_cells, rounded.shape[1] + 1), dtype=np.int64)
    np.add.at(table[:, :-1], cells, rounded * weight[:, None])
    table[:, -1] = scale * np.bincount(cells, weights=weight, minlength=num_cells).astype(np.int64)
    return table


def noisy_table(
    x: torch.Tensor, cells: torch.Tensor, num_cells: int, *, noise_multiplier: float, source: random.Random,
    kept: np.ndarray | None = None,
) -> np.ndarray:
    """``[cells, D + 1]`` int64 in grid units: the table of :func:`integer_table` plus one discrete Gaussian over
    every entry, of :func:`row_bound`'s sampled unit for the secret Poisson sample ``kept`` (None: every row)."""
    table = integer_table(x, cells, num_cells, kept=kept)
    sigma = noise_multiplier * row_bound(sums_grid(x.shape[1]), sampled=kept is not None)
    return table + discrete_gaussian(table.size, sigma=sigma, source=source).reshape(table.shape)


def noisy_cell_statistics(
    x: torch.Tensor, cells: torch.Tensor, num_cells: int, *, noise_multiplier: float, source: random.Random,
    kept: np.ndarray | None = None,
) -> tuple[np.ndarray, torch.Tensor]:
    """Noisy counts ``[cells]`` and sums ``[cells, D]`` in data units (:func:`noisy_table`)."""
    return table_in_data_units(noisy_table(x, cells, num_cells, noise_multiplier=noise_multiplier, source=source, kept=kept))


def integer_table(x: torch.Tensor, cells: torch.Tensor, num_cells: int, *, kept: np.ndarray | None = None) -> np.ndarray:
    """``[cells, D + 1]``: the clipped rows ``x`` rounded to :func:`sums_grid`, summed per cell with their counts (the noise's input)."""
    grid = sums_grid(x.shape[1])
    rounded = np.rint(x.double().cpu().numpy() / grid.step).astype(np.int64)
    return cell_table(rounded, cells.cpu().numpy(), num_cells, count_scale(grid), kept=kept)


def table_in_data_units(table: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
    """Counts ``[cells]`` and sums ``[cells, D]`` in data units from a ``[cells, D + 1]`` table in grid units."""
    grid = sums_grid(table.shape[1] - 1)
    counts = table[:, -1].astype(np.float64) / count_scale(grid)
    return counts, torch.from_numpy(table[:, :-1].astype(np.float64) * grid.step)


def summed_count_std(noise_multiplier: float, *, dim: int, sampled: bool, releases_summed: float) -> float:
    """Std, in rows, of a summed table's count noise that holds ``releases_summed`` releases' noise at
    ``noise_multiplier`` (``ldp-sums``: one per client; ``ddp-sums``: clients over ``K_min``)."""
    grid = sums_grid(dim)
    return noise_multiplier * row_bound(grid, sampled=sampled) * math.sqrt(releases_summed) / count_scale(grid)


def lloyd_step(
    previous: torch.Tensor, counts: np.ndarray, sums: torch.Tensor, *, threshold: float, momentum: float = 0.0
) -> torch.Tensor:
    """New global centroids (post-processing): a cell whose noisy count reaches ``threshold`` becomes
    ``normalise(momentum * previous + (1 - momentum) * normalise(sum))``, an EMA over rounds' noise; the others stay."""
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    before = previous.detach().double()
    moved = torch.from_numpy(counts >= threshold) & (sums.norm(dim=1) > 0)
    updated = before.clone()
    step = F.normalize(sums[moved], dim=1)
    updated[moved] = F.normalize(momentum * before[moved] + (1.0 - momentum) * step, dim=1)
    return updated.to(previous.dtype)


def step_threshold(count_std: float) -> float:
    """The summed noisy count a cell needs to move (public): :data:`STEP_THRESHOLD_STDS` count stds, at least a row."""
    return max(STEP_THRESHOLD_STDS * count_std, 1.0)


def summed_table_step(previous: torch.Tensor, table: np.ndarray, *, count_std: float, momentum: float) -> torch.Tensor:
    """The step from a round's summed ``[G, D + 1]`` table (grid units) both ``ldp-sums`` and ``ddp-sums`` take: a
    cell whose noisy count passes :func:`step_threshold` moves towards its summed direction (:func:`lloyd_step`)."""
    counts, sums = table_in_data_units(table)
    return lloyd_step(previous, counts, sums, threshold=step_threshold(count_std), momentum=momentum)


def check_momentum(momentum: float) -> float:
    """``momentum`` as a float, refused (ValueError) outside ``[0, 1)``."""
    if not (isinstance(momentum, (int, float)) and 0.0 <= momentum < 1.0):
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    return float(momentum)


class TableCalibration(Mechanism):
    """The calibration ``ldp-sums`` and ``ddp-sums`` share: one Gaussian on the table, on the run's secret sample."""

    guarantee_kind = DIFFERENTIAL_PRIVACY
    #: ``secret_sample``: release from a secret Poisson sample of every image's representation; ``momentum``: the
    #: server's EMA over its steps (:func:`lloyd_step`).
    settings: ClassVar[Mapping[str, Any]] = MappingProxyType({"secret_sample": True, "momentum": DEFAULT_MOMENTUM})

    @classmethod
    def planned_parameters(cls, request: PlanRequest, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The calibration, and the server's momentum (post-processing, so outside the calibration)."""
        return {**super().planned_parameters(request, settings), "momentum": check_momentum(settings["momentum"])}

    @classmethod
    def calibration_options(cls, request: PlanRequest, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {"sampling_rate": request.secret_sample_rate if settings.get("secret_sample", True) else 1.0}

    @classmethod
    def calibrate(
        cls, *, epsilon: float, delta: float, num_releases: int, sampling_rate: float = 1.0
    ) -> dict[str, float]:
        """The multiplier whose ``num_releases`` releases, each on a sample of rate ``sampling_rate``, fit."""
        multiplier = sums_noise_multiplier(epsilon, delta, num_releases=num_releases, sampling_rate=sampling_rate)
        return {"noise_multiplier": multiplier, "delta": float(delta), "sampling_rate": float(sampling_rate)}


@register_mechanism
class LdpSumsMechanism(TableCalibration, TableReleaseMechanism):
    """(epsilon, delta)-DP noisy sums and counts per cell of a public partition (the previous global centroids),
    which the server adds up over a round's clients."""

    name = "ldp-sums"
    description = (
        "noisy per-cell sums and counts over the previous global centroids' cells (one discrete Gaussian); "
        "(epsilon, delta) per release"
    )

    def __init__(
        self,
        *,
        epsilon: float | None = None,
        delta: float = DEFAULT_DELTA,
        noise_multiplier: float | None = None,
        count_threshold: float | None = None,
        sampling_rate: float = 1.0,
        momentum: float = DEFAULT_MOMENTUM,
        noise_source: random.Random | None = None,
    ) -> None:
        """From a ``noise_multiplier`` (noise std over the row bound), or calibrated to ``epsilon`` (default 1.0) per
        release. ``count_threshold`` (public) defaults to ``max(3 * count noise std, 1)``; ``sampling_rate`` 1: no
        secret sample; ``momentum`` is the server's EMA (:func:`lloyd_step`). Leave ``noise_source`` unset (the OS
        CSPRNG)."""
        if noise_multiplier is not None and epsilon is not None:
            raise ValueError("give either epsilon or noise_multiplier, not both")
        check_sampling_rate(sampling_rate)
        if noise_multiplier is None:
            noise_multiplier = sums_noise_multiplier(
                DEFAULT_EPSILON if epsilon is None else epsilon, delta, num_releases=1, sampling_rate=sampling_rate
            )
        if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
            raise ValueError(f"ldp-sums noise_multiplier must be positive and finite, got {noise_multiplier!r}")
        for dim in (1, MAX_DIMENSION):
            try:
                check_sigma(noise_multiplier * row_bound(sums_grid(dim), sampled=sampling_rate < 1))
            except ValueError as err:
                raise ValueError(f"ldp-sums noise_multiplier {noise_multiplier!r}: {err}") from None
        self.noise_multiplier = float(noise_multiplier)
        self.delta = delta
        self.count_threshold = count_threshold
        self.sampling_rate = float(sampling_rate)
        self.momentum = check_momentum(momentum)
        self.noise_source = noise_source
        self.centres: torch.Tensor | None = None

    def observe_global_centroids(self, centroids: torch.Tensor) -> None:
        """The previous global centroids (public) become the partition centres."""
        self.centres = centroids.detach().double().cpu()

    @property
    def input_sampling_rate(self) -> float:
        return self.sampling_rate

    @property
    def epsilon(self) -> float:
        """Per-release epsilon at ``delta`` (see :func:`release_epsilon`; sampled, the ledger's PLD)."""
        if self.sampling_rate < 1:
            return sampled_release_epsilon(self.noise_multiplier, self.delta, self.sampling_rate)
        return release_epsilon(self.noise_multiplier, self.delta)

    @property
    def threshold(self) -> float:
        """The public count threshold a released cell's noisy count reaches."""
        if self.count_threshold is not None:
            return self.count_threshold
        return max(THRESHOLD_STDS * self.count_noise_std, 1.0)

    @property
    def count_noise_std(self) -> float:
        """An upper bound on a noisy count's std, in rows, over every dimension (the sampled unit is up to sqrt 2 larger)."""
        per_multiplier = math.hypot(COUNT_STD_PER_MULTIPLIER, 1.0) if self.sampling_rate < 1 else COUNT_STD_PER_MULTIPLIER
        return per_multiplier * self.noise_multiplier

    def rows_per_vector(self, *, rows: int, dim: int, num_centroids: int) -> float | None:
        """The count threshold (a cell's sum noise is not asked to be smaller)."""
        return self.threshold

    def privacy_events(self) -> tuple[PrivacyEvent, ...]:
        """One Gaussian over the whole table per release (Poisson-subsampled when ``sampling_rate`` < 1)."""
        return (table_event(self.noise_multiplier, sampling_rate=self.sampling_rate),)

    @classmethod
    def max_total_weight(cls, *, num_reps: int, params: dict[str, Any]) -> float:
        """``num_reps`` (what the cells' true counts total at most) plus :data:`WEIGHT_NOISE_SCALES` noise stds."""
        return float(num_reps) + WEIGHT_NOISE_SCALES * cls(**params).count_noise_std

    def guarantee(self, *, num_reps: int, num_centroids: int) -> Guarantee:
        sample = "" if self.sampling_rate == 1 else f", on a secret Poisson sample of rate {self.sampling_rate:.3g}"
        return replace_one_dp_guarantee(
            self.epsilon, self.delta, accounting=f"the per-cell sums and counts accounted as one Gaussian{sample}",
            covers="the released table of noisy sums and counts and all computed from it",
        )

    def partition_centres(self, dim: int, num_centroids: int, generator: torch.Generator) -> torch.Tensor:
        """The previous global centroids, or (round 0) ``num_centroids`` random unit vectors from ``generator``."""
        if self.centres is None:
            return F.normalize(torch.randn(num_centroids, dim, generator=generator, dtype=torch.float64), dim=1)
        if self.centres.ndim != 2 or self.centres.shape[1] != dim or self.centres.shape[0] < 1:
            raise ValueError(f"partition centres of shape {tuple(self.centres.shape)} do not fit {dim}-dimensional rows")
        if not bool(torch.isfinite(self.centres).all()):
            raise ValueError("partition centres hold NaN or Inf")
        return self.centres

    def release(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> TableRelease:
        return self.release_with_members(reps, num_centroids=num_centroids, generator=generator)[0]

    def release_with_members(
        self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
    ) -> tuple[TableRelease, torch.Tensor]:
        """The release, and each row's vector in its view (``-1`` when its cell is not in the view)."""
        n, dim = reps.shape
        if dim > MAX_DIMENSION:
            raise ValueError(f"ldp-sums releases representations of at most {MAX_DIMENSION} dimensions, got {dim}")
        if num_centroids < 1:
            raise ValueError(f"num_centroids must be >= 1, got {num_centroids}")
        centres = self.partition_centres(dim, num_centroids, generator)
        source = self.noise_source if self.noise_source is not None else secure_source()
        kept = poisson_sample_mask(n, self.sampling_rate, source=source) if self.sampling_rate < 1 else None
        x = clip_to_radius(reps.detach().double().cpu(), 1.0)
        cells = nearest_cells(x, centres)
        table = torch.from_numpy(
            noisy_table(x, cells, centres.shape[0], noise_multiplier=self.noise_multiplier, source=source, kept=kept)
        )
        chosen = self._viewed_cells(table, num_centroids)
        vectors, weights = self._view_of(table, chosen)
        release = TableRelease(
            vectors=vectors.to(reps.dtype),
            weights=weights,
            guarantee=self.guarantee(num_reps=n, num_centroids=num_centroids),
            events=self.privacy_events(),
            metrics={
                "cells": float(centres.shape[0]),
                "noisy_num_reps": float(table[:, -1].sum()) / count_scale(sums_grid(dim)),
                "viewed_cells": float(chosen.numel()),
                "epsilon": self.epsilon,
                "delta": self.delta,
            },
            table=table,
        )
        position = torch.full((centres.shape[0],), -1, dtype=torch.long)  # each cell's vector in the view
        position[chosen] = torch.arange(chosen.numel())
        members = position[cells]
        if kept is not None:
            members[~torch.from_numpy(kept)] = -1
        return release, members

    def table_view(self, table: torch.Tensor, *, num_centroids: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Of the cells whose noisy count reaches :attr:`threshold` with a nonzero sum, the ``num_centroids`` of
        largest count: their unit noisy sums (float32) and noisy counts (float32)."""
        return self._view_of(table, self._viewed_cells(table, num_centroids))

    def _viewed_cells(self, table: torch.Tensor, num_centroids: int) -> torch.Tensor:
        counts, sums = table_in_data_units(table.numpy())
        noisy = torch.from_numpy(counts)
        usable = torch.nonzero((noisy >= self.threshold) & (sums.norm(dim=1) > 0)).squeeze(1)
        return usable[torch.argsort(noisy[usable], descending=True, stable=True)][:num_centroids]

    @staticmethod
    def _view_of(table: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts, sums = table_in_data_units(table[chosen].numpy())
        return F.normalize(sums, dim=1).float(), torch.from_numpy(counts).float()

    def check_table(self, table: torch.Tensor, *, num_reps: int, num_cells: int, dim: int) -> None:
        """Refuses a table of another shape, or whose sums or counts lie beyond what ``num_reps`` clipped rows and
        :data:`NOISE_TAIL_STDS` of the noise reach: each count in ``[-tail, res n + tail]``, their total within
        ``tail sqrt(cells)`` of ``[0, res n]``; each sum's norm within ``s n + r``, their total within
        ``s n + cells r``, for a noise vector's length ``r = sigma (sqrt(D) + 20)``. Not checked: that a cell's sum
        points into its own cell, as an honest one does (tests/mechanisms/test_ldp_sums_hostile_tables.py)."""
        if table.dtype != torch.int64 or tuple(table.shape) != (num_cells, dim + 1):
            raise ValueError(f"the table is {table.dtype} {tuple(table.shape)}, not int64 ({num_cells}, {dim + 1})")
        grid = sums_grid(dim)
        sigma = self.noise_multiplier * row_bound(grid, sampled=self.sampling_rate < 1)
        tail, res = NOISE_TAIL_STDS * sigma, count_scale(grid)
        counts = table[:, -1].double()
        if float(counts.min()) < -tail or float(counts.max()) > res * num_reps + tail:
            raise ValueError(f"a cell's count lies outside [-{tail:.4g}, {res * num_reps + tail:.4g}] grid steps")
        if not -tail * math.sqrt(num_cells) <= float(counts.sum()) <= res * num_reps + tail * math.sqrt(num_cells):
            raise ValueError(f"the counts total outside what {num_reps} rows and the noise hold")
        norms = table[:, :-1].double().norm(dim=1)
        noise_norm = sigma * (math.sqrt(dim) + NOISE_TAIL_STDS)
        if float(norms.max()) > grid.sensitivity * num_reps + noise_norm or (
            float(norms.sum()) > grid.sensitivity * num_reps + num_cells * noise_norm
        ):
            raise ValueError(f"the sums are longer than {num_reps} clipped rows and the noise reach")

    def combine_tables(self, tables: Sequence[torch.Tensor], *, centroids: torch.Tensor) -> torch.Tensor:
        """One Lloyd step from the round's summed tables, each holding its client's whole noise
        (:func:`summed_table_step`)."""
        if not tables:
            raise ValueError("a round's step needs at least one table")
        shape = (centroids.shape[0], centroids.shape[1] + 1)
        if any(tuple(t.shape) != shape or t.dtype != torch.int64 for t in tables):
            raise ValueError(f"every table must be int64 {shape}, over the centroids the clients were sent")
        total = torch.stack(list(tables)).sum(dim=0).numpy()
        count_std = summed_count_std(
            self.noise_multiplier, dim=centroids.shape[1], sampled=self.sampling_rate < 1, releases_summed=len(tables)
        )
        return summed_table_step(centroids, total, count_std=count_std, momentum=self.momentum)
