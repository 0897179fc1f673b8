"""Review of ``LdpSumsMechanism.check_table``: what a table that passes it lets one hostile client do.

Within the check a hostile client can still use the noise's room against the others: counts of -20 sigma in as many
cells as the counts' total allows (sqrt of the cells; every cell at once is refused) stop weakly held cells from
moving; and a whole sum budget pointed outside the cell's own cone merges two centroids at low momentum. Neither is
a privacy loss; both are robustness (docs/privacy.md, "The server's step").
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mechanisms.ldp_sums import NOISE_TAIL_STDS, LdpSumsMechanism, count_scale, row_bound, sums_grid

DIM, CELLS, ROWS = 8, 4, 16


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def unit(rows: int, dim: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(rows, dim, generator=gen(seed)), dim=1)


def honest_tables(
    centres: torch.Tensor, *, per_cell: int, clients: int, seed: int, noise_multiplier: float, momentum: float
) -> list[torch.Tensor]:
    """Each client: ``per_cell`` rows near every centre, released by the mechanism itself."""
    mechanism = LdpSumsMechanism(noise_multiplier=noise_multiplier, delta=1e-6, momentum=momentum, noise_source=random.Random(seed))
    mechanism.observe_global_centroids(centres)
    tables = []
    for k in range(clients):
        g = gen(seed + k)
        rows = F.normalize(centres.repeat_interleave(per_cell, 0) + 0.3 * torch.randn(per_cell * CELLS, DIM, generator=g), dim=1)
        tables.append(mechanism.release(rows, num_centroids=CELLS, generator=gen()).table)
    return tables


def sigma_of(mechanism: LdpSumsMechanism) -> float:
    return mechanism.noise_multiplier * row_bound(sums_grid(DIM), sampled=False)


def test_negative_counts_in_every_cell_are_refused_and_in_sqrt_cells_of_them_freeze_those() -> None:
    params = {"noise_multiplier": 2.0, "momentum": 0.0}
    server = LdpSumsMechanism(noise_multiplier=2.0, delta=1e-6, momentum=0.0)
    centres = unit(CELLS, DIM, seed=3)
    tables = honest_tables(centres, per_cell=4, clients=10, seed=100, **params)
    floor = -math.floor(NOISE_TAIL_STDS * sigma_of(server))
    everywhere = torch.zeros(CELLS, DIM + 1, dtype=torch.int64)
    everywhere[:, -1] = floor  # every cell at -20 sigma at once: no honest client's noise reaches that
    with pytest.raises(ValueError, match="counts total"):
        server.check_table(everywhere, num_reps=ROWS, num_cells=CELLS, dim=DIM)
    hostile = torch.zeros(CELLS, DIM + 1, dtype=torch.int64)
    hostile[: math.isqrt(CELLS), -1] = floor
    server.check_table(hostile, num_reps=ROWS, num_cells=CELLS, dim=DIM)  # accepted
    honest_zero_rows = honest_tables(centres, per_cell=0, clients=1, seed=900, **params)[0]

    def moved(ts: list[torch.Tensor]) -> int:
        return int(((server.combine_tables(ts, centroids=centres) - centres).norm(dim=1) > 0).sum())

    assert moved(tables) == CELLS and moved([*tables, honest_zero_rows]) == CELLS
    assert moved([*tables, hostile]) == CELLS - math.isqrt(CELLS)  # one client of 16 rows holds back 40 rows a cell
    shift_rows = NOISE_TAIL_STDS * sigma_of(server) / count_scale(sums_grid(DIM))
    assert shift_rows > ROWS  # more than the client's own rows, in each of those cells


def test_one_table_may_point_a_cells_whole_sum_at_another_centroid_and_merge_the_two() -> None:
    """An honest row in cell 0 is nearer centre 0 than centre 1, so honest data cannot pull centre 0 onto centre 1
    in one step at momentum 0; a table that passes the check does (count and sum of a client's 16 rows)."""
    params = {"noise_multiplier": 0.5, "momentum": 0.0}
    server = LdpSumsMechanism(noise_multiplier=0.5, delta=1e-6, momentum=0.0)
    centres = unit(CELLS, DIM, seed=5)
    tables = honest_tables(centres, per_cell=1, clients=3, seed=200, **params)  # cell 0 held weakly
    grid = sums_grid(DIM)
    hostile = torch.zeros(CELLS, DIM + 1, dtype=torch.int64)
    hostile[0, :-1] = torch.from_numpy(np.rint(centres[1].double().numpy() * grid.sensitivity * ROWS).astype(np.int64))
    hostile[0, -1] = count_scale(grid) * ROWS
    server.check_table(hostile, num_reps=ROWS, num_cells=CELLS, dim=DIM)  # accepted
    stepped = server.combine_tables([*tables, hostile], centroids=centres)
    assert float(F.cosine_similarity(stepped[0:1], centres[1:2])) > 0.97  # centre 0 now sits on centre 1


@pytest.mark.parametrize("value", [2**62, -(2**62), 2**63 - 1])
def test_extreme_entries_are_refused_with_a_value_error(value: int) -> None:
    server = LdpSumsMechanism(noise_multiplier=2.0, delta=1e-6)
    for column in (0, DIM):
        table = torch.zeros(CELLS, DIM + 1, dtype=torch.int64)
        table[1, column] = value
        with pytest.raises(ValueError):
            server.check_table(table, num_reps=ROWS, num_cells=CELLS, dim=DIM)
