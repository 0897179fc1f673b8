"""``ldp-sums``: noisy per-cell sums and counts over a public partition, checked against its own accounting.

The audit follows ``tests/mechanisms/test_ldp_audit.py``: worst-case canaries,
each in its own cell, are released many times at once by the mechanism's own
:func:`~mechanisms.ldp_sums.noisy_cell_statistics`; a threshold test fixed in
advance gives a Clopper-Pearson lower bound on epsilon, which stays below the
accountant's at the calibrated noise and exceeds it at half that noise.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from mechanisms import TableRelease, accounting, available_mechanisms, create_mechanism
from mechanisms.ldp_sums import (
    LdpSumsMechanism,
    cell_table,
    count_scale,
    nearest_cells,
    noisy_cell_statistics,
    step_threshold,
    summed_count_std,
    summed_table_step,
    sums_grid,
    table_in_data_units,
)
from privfed.config import build_config
from privfed.privacy.budget import plan_privacy
from tests.mechanisms.test_ldp_audit import epsilon_lower_bound

#: Noise so small (std about 0.05 of one row or one count) that the tests below can read the true table through it.
NO_NOISE = dict(noise_multiplier=0.05)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def clustered(n: int, dim: int, centres: torch.Tensor, spread: float = 0.1, seed: int = 0) -> torch.Tensor:
    g = gen(seed)
    labels = torch.randint(0, centres.shape[0], (n,), generator=g)
    return F.normalize(centres[labels] + spread * torch.randn(n, dim, generator=g), dim=1)


def unit(rows: int, dim: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(rows, dim, generator=gen(seed)), dim=1)


def test_ldp_sums_is_registered_as_a_dp_mechanism():
    assert "ldp-sums" in available_mechanisms()
    mechanism = create_mechanism("ldp-sums")
    assert isinstance(mechanism, LdpSumsMechanism) and mechanism.is_differentially_private()


@pytest.mark.parametrize("n", [0, 1, 40, 600])
@pytest.mark.parametrize("observed", [False, True])
def test_a_release_is_its_noisy_table_and_its_view_the_heaviest_cells_above_the_threshold(n, observed):
    centres = unit(16, 32, seed=1)
    mechanism = create_mechanism("ldp-sums", epsilon=10.0, noise_source=random.Random(n))
    if observed:
        mechanism.observe_global_centroids(centres)
    release = mechanism.release(clustered(n, 32, centres[:4]), num_centroids=8, generator=gen())
    assert isinstance(release, TableRelease)
    assert release.table.dtype == torch.int64 and release.table.shape == (16 if observed else 8, 33)
    vectors, weights = mechanism.table_view(release.table, num_centroids=8)
    assert torch.equal(vectors, release.vectors) and torch.equal(weights, release.weights)
    viewed = release.num_vectors
    assert viewed <= 8 and release.metrics["viewed_cells"] == viewed
    assert torch.allclose(release.vectors.norm(dim=1), torch.ones(viewed), atol=1e-5)
    assert (release.weights >= mechanism.threshold).all()
    assert (release.weights[:-1] >= release.weights[1:]).all()  # heaviest first
    assert release.guarantee.kind == "differential-privacy" and release.guarantee.epsilon <= 10.0 * (1 + 1e-9)
    assert release.events == mechanism.privacy_events()
    if n == 600 and observed:
        assert viewed == 4  # the four clusters' own cells, and no empty cell
    if n == 0:
        assert viewed == 0


def test_round_zero_partitions_by_random_unit_vectors_drawn_from_the_generator():
    """No previous centroids: the cells are those of L public random directions, not nothing and not one mean."""
    dim, L = 16, 4
    x = clustered(300, dim, unit(4, dim, seed=2))
    first = create_mechanism("ldp-sums", **NO_NOISE, noise_source=random.Random(5))
    round_zero = first.release(x, num_centroids=L, generator=gen(9))
    assert first.centres is None and round_zero.metrics["cells"] == L
    second = create_mechanism("ldp-sums", **NO_NOISE, noise_source=random.Random(5))
    second.observe_global_centroids(F.normalize(torch.randn(L, dim, generator=gen(9), dtype=torch.float64), dim=1))
    observed = second.release(x, num_centroids=L, generator=gen(9))
    assert torch.equal(round_zero.weights, observed.weights)
    real = round_zero.weights > 0
    assert int(real.sum()) >= 2 and torch.allclose(round_zero.vectors[real], observed.vectors[real])


def nearly_noiseless(centres: torch.Tensor):
    """ldp-sums at almost no noise, a threshold of one row, partitioned by ``centres``."""
    mechanism = create_mechanism("ldp-sums", **NO_NOISE, count_threshold=1.0, noise_source=random.Random(0))
    mechanism.observe_global_centroids(centres)
    return mechanism


def test_rows_go_to_their_nearest_centroids_cell_and_its_vector_is_their_mean_direction():
    dim = 8
    centres = unit(6, dim, seed=3)
    x = clustered(200, dim, centres, spread=0.6, seed=4)
    mechanism = nearly_noiseless(centres)
    release, members = mechanism.release_with_members(x, num_centroids=6, generator=gen())
    nearest = (x @ centres.T).argmax(dim=1)
    assert torch.equal(nearest_cells(x.double(), centres), nearest)
    for cell in range(6):
        rows = nearest == cell
        if not rows.any():
            continue
        index = int(members[rows][0])
        assert (members[rows] == index).all() and release.weights[index] == pytest.approx(float(rows.sum()), abs=0.3)
        mean_direction = F.normalize(x[rows].sum(dim=0), dim=0)
        assert float(release.vectors[index] @ mean_direction) > 0.999
    assert int((release.weights > 0).sum()) == int(nearest.unique().numel())


def test_only_the_L_heaviest_cells_of_more_are_released():
    dim = 8
    centres = unit(12, dim, seed=6)
    x = clustered(600, dim, centres, spread=0.05, seed=7)
    mechanism = nearly_noiseless(centres)
    release = mechanism.release(x, num_centroids=3, generator=gen())
    counts = torch.bincount(nearest_cells(x.double(), centres), minlength=12).double()
    assert torch.allclose(release.weights.double(), counts.sort(descending=True).values[:3], atol=0.3)


@pytest.mark.parametrize("dim", [1, 2, 16, 512])
def test_a_replaced_row_moves_the_table_by_at_most_twice_the_row_bound(dim):
    """The sensitivity the accountant charges (replace-one shift 2s), measured on the mechanism's own table."""
    grid = sums_grid(dim)
    centres = unit(5, dim, seed=8).double()
    data = unit(30, dim, seed=9).double()
    largest = 0.0
    for trial in range(60):
        neighbour = data.clone()
        neighbour[trial % 30] = -data[trial % 30] if trial % 2 else unit(1, dim, seed=100 + trial)[0].double()

        def table(rows: torch.Tensor) -> np.ndarray:
            rounded = np.rint(rows.numpy() / grid.step).astype(np.int64)
            return cell_table(rounded, nearest_cells(rows, centres).numpy(), 5, count_scale(grid))

        shift = float(np.linalg.norm(table(neighbour) - table(data)))
        assert shift <= accounting.REPLACEMENT_SHIFT * grid.sensitivity
        largest = max(largest, shift)
    assert count_scale(grid) <= grid.sensitivity
    assert largest >= 0.98 * 2 * count_scale(grid)  # the bound is reached, up to rounding: not vacuous


@pytest.mark.parametrize("epsilon,delta,releases", [(10.0, 1e-6, 21), (1.0, 1e-3, 51), (0.1, 1e-5, 1)])
def test_calibration_reaches_the_target_epsilon_and_not_beyond(epsilon, delta, releases):
    params = LdpSumsMechanism.calibrate(epsilon=epsilon, delta=delta, num_releases=releases)
    mechanism = create_mechanism("ldp-sums", **params)
    reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4 * epsilon)
    reference.compose(
        dp_event.GaussianDpEvent(mechanism.noise_multiplier / accounting.REPLACEMENT_SHIFT), releases
    )
    assert 0.98 * epsilon <= reference.get_epsilon(delta) <= epsilon * (1 + 1e-9)
    assert accounting.epsilon_of(mechanism.privacy_events() * releases, delta) <= epsilon * 1.005


def test_privfeds_budget_plan_takes_ldp_sums_unchanged():
    config = build_config(dataset="shapes:500", num_clients=3, participation=1.0, num_global_centroids=8, rounds=4,
                          mechanism="ldp-sums", epsilon=10.0)
    plan = plan_privacy(config, [40, 120, 250])
    assert plan.params["noise_multiplier"] > 0 and 0.98 * 10.0 <= plan.planned_epsilon <= 10.0


@pytest.mark.parametrize(
    "value, named",
    [(1e12, "cannot be drawn"), (1e-12, "cannot be drawn"), (float("nan"), "positive and finite"),
     (0.0, "positive and finite"), (-1.0, "positive and finite")],
)
def test_noise_the_sampler_cannot_draw_is_refused_when_the_mechanism_is_built(value, named):
    with pytest.raises(ValueError, match=named):
        create_mechanism("ldp-sums", noise_multiplier=value)


@pytest.mark.parametrize("method", ["release", "release_with_members"])
def test_non_finite_input_is_refused_before_any_noise(method):
    memory = unit(20, 8, seed=1)
    memory[3, 2] = float("inf")
    with pytest.raises(ValueError, match="1 of 20 representations hold NaN or Inf"):
        getattr(create_mechanism("ldp-sums"), method)(memory, num_centroids=4, generator=gen())


def test_partition_centres_of_another_width_or_not_finite_are_refused():
    mechanism = create_mechanism("ldp-sums")
    mechanism.observe_global_centroids(unit(4, 9, seed=0))
    with pytest.raises(ValueError, match="do not fit 8-dimensional rows"):
        mechanism.release(unit(10, 8, seed=1), num_centroids=4, generator=gen())
    mechanism.observe_global_centroids(torch.full((4, 8), float("nan")))
    with pytest.raises(ValueError, match="partition centres hold NaN or Inf"):
        mechanism.release(unit(10, 8, seed=1), num_centroids=4, generator=gen())


# --------------------------------------------------------------------------- audit

TRIALS = 200_000
AUDIT_DELTA = 1e-3


def calibrated_multiplier() -> float:
    return create_mechanism("ldp-sums", epsilon=2.0).noise_multiplier


def claimed_epsilon() -> float:
    return accounting.epsilon_of(create_mechanism("ldp-sums", epsilon=2.0).privacy_events(), AUDIT_DELTA)


def canary_statistics(rows: torch.Tensor, cells: np.ndarray, num_cells: int, multiplier: float, seed: int):
    """Each trial has its own cells, so one call of the mechanism's own function releases all of them."""
    return noisy_cell_statistics(rows.double(), torch.from_numpy(cells), num_cells, noise_multiplier=multiplier,
                                 source=random.Random(seed))


@pytest.mark.parametrize("noise_scale,caught", [(1.0, False), (0.5, True)])
def test_an_antipodal_canary_in_one_cell_catches_half_the_calibrated_noise(noise_scale, caught):
    """Neighbours: the canary is +e1 or, replaced, -e1 in the same cell; the test: is the sum above a threshold?"""
    z = calibrated_multiplier()
    canary = torch.ones(TRIALS, 1)
    cells = np.arange(TRIALS)
    _, with_canary = canary_statistics(canary, cells, TRIALS, z * noise_scale, seed=1)
    _, replaced = canary_statistics(-canary, cells, TRIALS, z * noise_scale, seed=2)
    threshold = 1.5 * z  # fixed in advance, from the claimed noise
    bound = epsilon_lower_bound(int((with_canary[:, 0] > threshold).sum()), int((replaced[:, 0] > threshold).sum()),
                                TRIALS, AUDIT_DELTA)
    assert (bound > claimed_epsilon()) == caught, (bound, claimed_epsilon())


@pytest.mark.parametrize("noise_scale,caught", [(1.0, False), (0.5, True)])
def test_a_canary_moved_between_cells_catches_half_the_calibrated_noise(noise_scale, caught):
    """Neighbours: +e1 in cell a, or -e1 in cell b: sums and counts move together, by the full 2s.

    The test reads the table along that move: ``sum_a + count_a + sum_b - count_b`` (mean 2 or -2).
    """
    z = calibrated_multiplier()
    canary = torch.ones(TRIALS, 1)
    in_a, in_b = 2 * np.arange(TRIALS), 2 * np.arange(TRIALS) + 1
    statistics = []
    for rows, cells, seed in ((canary, in_a, 3), (-canary, in_b, 4)):
        counts, sums = canary_statistics(rows, cells, 2 * TRIALS, z * noise_scale, seed=seed)
        statistics.append(sums[0::2, 0].numpy() + counts[0::2] + sums[1::2, 0].numpy() - counts[1::2])
    threshold = 3.0 * z  # fixed in advance: 1.5 of the statistic's claimed std (about 2z), as above
    bound = epsilon_lower_bound(int((statistics[0] > threshold).sum()), int((statistics[1] > threshold).sum()),
                                TRIALS, AUDIT_DELTA)
    assert (bound > claimed_epsilon()) == caught, (bound, claimed_epsilon())


def coupled_release(monkeypatch, memory: torch.Tensor, centres: torch.Tensor | None, noise_for) -> tuple:
    """A release whose noise is ``noise_for(true_table, sigma)``: lets two memories share one noisy table."""
    import mechanisms.ldp_sums as ldp_sums

    seen = {}
    true_table = ldp_sums.cell_table

    def recording_table(*args, **kwargs):
        seen["table"] = true_table(*args, **kwargs)
        return seen["table"]

    monkeypatch.setattr(ldp_sums, "cell_table", recording_table)
    monkeypatch.setattr(ldp_sums, "discrete_gaussian", lambda size, *, sigma, source: noise_for(seen["table"], sigma).reshape(-1))
    mechanism = LdpSumsMechanism(epsilon=2.0)
    if centres is not None:
        mechanism.observe_global_centroids(centres)
    release = mechanism.release(memory, num_centroids=4, generator=gen(3))
    monkeypatch.undo()
    return release, seen["table"]


def neighbour_pairs() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Random and hostile neighbouring memories (one row replaced), with no, random or crafted partition centres."""
    pairs = []
    for case in range(24):
        dim = [1, 2, 8, 32][case % 4]
        g = torch.Generator().manual_seed(case)
        memory = F.normalize(torch.randn(30, dim, generator=g), dim=1) * (1 + 3 * torch.rand(30, 1, generator=g))
        other = memory.clone()
        other[case % 30] = 5 * torch.randn(dim, generator=g)
        row = slice(case % 30, case % 30 + 1)
        crafted = torch.cat([memory[row]] * 3 + [other[row]] * 3)  # one row decides a cell
        centres = [None, F.normalize(torch.randn(16, dim, generator=g), dim=1), crafted][case % 3]
        pairs.append((memory, other, centres))
    background = torch.tensor([[0.0, 1.0]]).repeat(29, 1)  # the canary alone in its cell, e1 against -e1
    pairs.append((torch.cat([torch.tensor([[1.0, 0.0]]), background]), torch.cat([torch.tensor([[-1.0, 0.0]]), background]),
                  torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])))
    return pairs


@pytest.mark.parametrize("case", range(25))
def test_neighbouring_memories_with_the_same_noisy_table_give_the_same_release(monkeypatch, case):
    """Everything released is a function of the noisy table: clipping, cell choice, threshold, weights, vectors."""
    memory, other, centres = neighbour_pairs()[case]
    rng = np.random.default_rng(case)
    drawn = {}

    def noise(table, sigma):
        drawn["noise"] = np.rint(rng.normal(0, sigma, size=table.shape)).astype(np.int64)
        drawn["noise"][:, -1] += int(5 * sigma)  # counts well above the threshold, so cells are released
        drawn["table"] = table
        return drawn["noise"]

    first, _ = coupled_release(monkeypatch, memory, centres, noise)
    second, _ = coupled_release(monkeypatch, other, centres, lambda table, sigma: drawn["noise"] + drawn["table"] - table)
    assert torch.equal(first.vectors, second.vectors) and torch.equal(first.weights, second.weights)
    assert first.metrics == second.metrics and first.guarantee == second.guarantee and first.events == second.events


def test_the_stated_epsilon_is_the_ledgers():
    mechanism = LdpSumsMechanism(epsilon=2.0)
    ledger = accounting.epsilon_of(mechanism.privacy_events(), mechanism.delta,
                                   discretisation=accounting.calibration_discretisation(2.0, 1))
    stated = mechanism.guarantee(num_reps=10, num_centroids=4).epsilon
    assert stated == pytest.approx(ledger, rel=0.01) and stated == pytest.approx(2.0, rel=0.01)


@pytest.mark.parametrize("case", range(25))
def test_the_release_paths_table_moves_by_at_most_twice_the_row_bound_between_neighbours(monkeypatch, case):
    """Through release() itself, with rows far outside the unit ball: clipping and rounding must keep the bound."""
    memory, other, centres = neighbour_pairs()[case]
    no_noise = lambda table, sigma: np.zeros_like(table)
    _, first = coupled_release(monkeypatch, 100 * memory, centres, no_noise)
    _, second = coupled_release(monkeypatch, 100 * other, centres, no_noise)
    assert np.linalg.norm((first - second).astype(np.float64)) <= 2 * sums_grid(memory.shape[1]).sensitivity


def tables_of(clients: list[torch.Tensor], centres: torch.Tensor, **params) -> list[torch.Tensor]:
    mechanism = create_mechanism("ldp-sums", **params, noise_source=random.Random(11))
    mechanism.observe_global_centroids(centres)
    return [mechanism.release(x, num_centroids=4, generator=gen()).table for x in clients]


@pytest.mark.parametrize("sampling_rate", [1.0, 0.5])
def test_the_servers_step_over_summed_ldp_sums_tables_equals_ddp_sums_combine_on_the_same_total(sampling_rate):
    """The same step, not a copy: ``ddp-sums`` with one share's worth of noise per client sums what ldp-sums's
    server sums, so both move the same cells to the same place (and leave the same cells where they were)."""
    from mechanisms.ddp_sums import MAX_MODULUS, DdpSumsMechanism

    centres = unit(6, 8, seed=21)
    clients = [clustered(30, 8, centres[:3], spread=0.2, seed=40 + k) for k in range(7)]  # cells 3 to 5 stay empty
    params = dict(noise_multiplier=2.0, delta=1e-6, sampling_rate=sampling_rate, momentum=0.3)
    tables = tables_of(clients, centres, **params)
    summing = LdpSumsMechanism(**params)
    stepped = summing.combine_tables(tables, centroids=centres)
    total = np.mod(torch.stack(tables).sum(dim=0).numpy().ravel(), MAX_MODULUS)
    combined = DdpSumsMechanism(**params, min_shares=1).combine(total, centroids=centres, num_summed=len(tables))
    assert torch.equal(stepped, combined)
    moved = (stepped - centres).norm(dim=1) > 0
    assert moved[:3].all() and not moved[3:].any()


def test_the_servers_step_moves_a_cell_whose_summed_count_passes_one_noise_std():
    """Summed counts of 2 and 0.5 count stds: the first cell moves (under a client's 3 stds, a summed direction is
    still worth taking), the second stays; an empty cell stays, and the threshold is never under one row."""
    dim, count_std = 8, 10.0
    centres, targets = unit(3, dim, seed=23), unit(3, dim, seed=24).double()
    grid = sums_grid(dim)
    table = np.zeros((3, dim + 1), dtype=np.int64)
    for cell, rows in ((0, 2.0 * count_std), (1, 0.5 * count_std)):
        table[cell, :-1] = np.rint(rows * targets[cell].numpy() / grid.step)
        table[cell, -1] = round(rows * count_scale(grid))
    stepped = summed_table_step(centres, table, count_std=count_std, momentum=0.0)
    assert float(stepped[0].double() @ targets[0]) > 0.999
    assert torch.equal(stepped[1:], centres[1:])
    assert step_threshold(count_std) == count_std and step_threshold(0.2) == 1.0


def test_the_sum_moves_cells_below_every_clients_own_threshold():
    """Nothing is lost below a client's threshold: 40 clients with 4 rows in each of two cells, under the 6 rows a
    client's view asks of a cell, and the summed tables still move both cells to their rows' pooled direction."""
    dim = 8
    centres = unit(4, dim, seed=22)
    clients = [
        torch.cat([clustered(4, dim, centres[c : c + 1], spread=0.3, seed=60 + 2 * k + c) for c in (0, 1)])
        for k in range(40)
    ]
    params = dict(noise_multiplier=2.0, delta=1e-6, momentum=0.0)
    mechanism = create_mechanism("ldp-sums", **params, noise_source=random.Random(12))
    mechanism.observe_global_centroids(centres)
    assert mechanism.threshold > 4
    tables = [mechanism.release(x, num_centroids=4, generator=gen()).table for x in clients]
    stepped = LdpSumsMechanism(**params).combine_tables(tables, centroids=centres)
    rows = torch.cat(clients).double()
    cells = nearest_cells(rows, centres)
    for cell in (0, 1):
        pooled = F.normalize(rows[cells == cell].sum(dim=0), dim=0)
        assert float(stepped[cell].double() @ pooled) > 0.95
    # The empty cells hold only noise: each moves exactly when its summed noisy count passes the step's threshold.
    counts, _ = table_in_data_units(torch.stack(tables).sum(dim=0).numpy())
    count_std = summed_count_std(2.0, dim=dim, sampled=False, releases_summed=len(tables))
    passed = torch.from_numpy(counts[2:] >= step_threshold(count_std))
    assert torch.equal((stepped[2:] != centres[2:]).any(dim=1), passed)


def test_the_step_refuses_tables_over_other_cells_or_none():
    centres = unit(4, 8, seed=23)
    summing = LdpSumsMechanism(noise_multiplier=1.0, delta=1e-6)
    with pytest.raises(ValueError, match="at least one table"):
        summing.combine_tables([], centroids=centres)
    with pytest.raises(ValueError, match="over the centroids"):
        summing.combine_tables([torch.zeros(5, 9, dtype=torch.int64)], centroids=centres)


@pytest.mark.parametrize("n", [0, 1, 50, 400])
@pytest.mark.parametrize("sampling_rate", [1.0, 0.5])
def test_honest_tables_pass_the_servers_bounds_and_inflated_ones_do_not(n, sampling_rate):
    dim, cells = 8, 6
    centres = unit(cells, dim, seed=24)
    mechanism = create_mechanism("ldp-sums", noise_multiplier=3.0, delta=1e-6, sampling_rate=sampling_rate,
                                 noise_source=random.Random(n))
    mechanism.observe_global_centroids(centres)
    x = clustered(n, dim, centres[:1], spread=0.01, seed=25)  # every row in one cell: the longest honest sum
    table = mechanism.release(x, num_centroids=4, generator=gen()).table
    mechanism.check_table(table, num_reps=n, num_cells=cells, dim=dim)
    res = count_scale(sums_grid(dim))
    heavier = table.clone()
    heavier[0, -1] += 2 * res * max(n, 1) + 100 * res
    longer = table.clone()
    longer[0, :-1] *= 3
    longer[0, 0] += 1000 * res
    for bad, why in ((heavier, "count"), (longer, "longer"), (table[:-1], "not int64"), (table.int(), "not int64")):
        with pytest.raises(ValueError, match=why):
            mechanism.check_table(bad, num_reps=n, num_cells=cells, dim=dim)
