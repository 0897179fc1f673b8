"""``benchmarks/dp_centroid_rounds.py`` on a tiny real configuration: the metric, the cadence and the noise models."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mechanisms.ldp_sums import count_scale, row_bound, step_threshold, sums_grid, sums_noise_multiplier
from tests.benchmarks.scripts import load_script

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "dp_centroid_rounds.py"


@pytest.fixture(scope="module")
def rounds() -> ModuleType:
    return load_script("dp_centroid_rounds", BENCHMARK)


@pytest.fixture(scope="module")
def tiny(rounds: ModuleType) -> Any:
    # memory 20 of a median 40 rows: a secret sample of rate 0.5, as at the cpu scale
    return rounds.Scale("tiny", dim=8, clusters=4, clients=6, per_round=3, rounds=6, smallest=30, median=40,
                        largest=60, memory=20)


@pytest.fixture(scope="module")
def data(rounds: ModuleType, tiny: Any) -> Any:
    return rounds.population(tiny, 0)


def test_the_scale_keeps_the_sizes_and_the_runs_sampling_rule(rounds: ModuleType, tiny: Any) -> None:
    sizes = tiny.sizes()
    assert len(sizes) == 6 and min(sizes) == 30 and max(sizes) == 60 and sorted(sizes) == sizes
    assert tiny.sampling_rate == pytest.approx(0.5)
    cpu = rounds.SCALES["cpu"]
    assert (min(cpu.sizes()), max(cpu.sizes())) == (29, 585) and 0.5 <= cpu.sampling_rate <= 0.7


def test_the_true_means_score_high_and_random_centroids_low(rounds: ModuleType, data: Any) -> None:
    assert rounds.centroid_cosine(data.everyone, data.means) > 0.7
    assert rounds.centroid_cosine(data.everyone, data.start) < rounds.centroid_cosine(data.everyone, data.means) - 0.2


def test_exact_tables_take_the_centroids_well_above_the_random_start(rounds: ModuleType, tiny: Any, data: Any) -> None:
    floor = rounds.centroid_cosine(data.everyone, data.start)
    exact = rounds.run(tiny, data, 0, model=None, epsilon=0.0, cadence=1, momentum=0.5)
    assert exact.releases == list(range(6))
    assert exact.cosine > floor + 0.2


@pytest.mark.parametrize("cadence", [2, 4])
def test_with_cadence_k_the_run_releases_ceil_r_over_k_times_and_holds_the_centroids_in_between(
    rounds: ModuleType, tiny: Any, data: Any, cadence: int
) -> None:
    trace = rounds.run(tiny, data, 0, model="ddp-sums", epsilon=1.0, cadence=cadence, momentum=0.5)
    assert len(trace.releases) == rounds.num_releases(6, cadence) == math.ceil(6 / cadence)
    assert trace.releases == list(range(0, 6, cadence))
    assert trace.moved[0] > 0  # the first release moves cells, so "held" below is not vacuous
    assert all(moved == 0 for r, moved in enumerate(trace.moved) if r not in trace.releases)
    assert len(trace.tail) == rounds.TAIL


def test_noise_at_epsilon_1_costs_centroid_cosine(rounds: ModuleType, tiny: Any, data: Any) -> None:
    exact = rounds.run(tiny, data, 0, model=None, epsilon=0.0, cadence=1, momentum=0.5)
    noisy = rounds.run(tiny, data, 0, model="ldp-sums-summed", epsilon=1.0, cadence=1, momentum=0.5)
    assert noisy.cosine < exact.cosine - 0.1


def test_the_summed_local_noise_is_sqrt_k_times_the_secure_sums(rounds: ModuleType) -> None:
    for sampled in (False, True):
        unit = row_bound(sums_grid(32), sampled=sampled)
        ddp = rounds.summed_noise_std("ddp-sums", 2.0, clients=10, dim=32, sampled=sampled)
        ldp = rounds.summed_noise_std("ldp-sums-summed", 2.0, clients=10, dim=32, sampled=sampled)
        assert ddp == pytest.approx(2.0 * unit)
        assert ldp == pytest.approx(math.sqrt(10) * ddp)
    with pytest.raises(ValueError, match="unknown noise model"):
        rounds.summed_noise_std("ldp-sums", 2.0, clients=10, dim=32, sampled=False)


def test_a_cadence_spreads_the_budget_over_fewer_releases_each_with_less_noise(rounds: ModuleType, tiny: Any) -> None:
    every, every_fourth = (rounds.round_noise(tiny, "ddp-sums", 1.0, k) for k in (1, 4))
    z = sums_noise_multiplier(1.0, rounds.DELTA, num_releases=2, sampling_rate=0.5)  # rounds 0 and 4 of 6
    assert every_fourth[0] == pytest.approx(z * row_bound(sums_grid(8), sampled=True))
    assert every_fourth[0] < every[0] / math.sqrt(2)  # 2 releases, not 6
    assert every_fourth[1] == pytest.approx(step_threshold(every_fourth[0] / count_scale(sums_grid(8))))
    assert rounds.round_noise(tiny, None, 1.0, 4) == (0.0, 1.0)
