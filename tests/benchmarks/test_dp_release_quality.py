"""The claims docs/privacy.md makes from ``benchmarks/dp_release_quality.py``, on the benchmark's own code (3 seeds)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tests.benchmarks.scripts import load_script

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "dp_release_quality.py"


@pytest.fixture(scope="module")
def quality():
    return load_script("dp_release_quality", BENCHMARK)


def mean_coverage(quality, column: str, *, dim: int, n: int, eps: float, delta: float = 1e-3) -> float:
    clients = [quality.make_client(dim, n, seed) for seed in range(3)]
    return statistics.fmean(quality.dp_scores(c, eps, delta)[column].coverage for c in clients)


def test_at_128_rows_d_512_and_epsilon_1_even_the_ideal_release_is_at_the_null(quality):
    null = statistics.fmean(quality.make_client(512, 128, seed).null for seed in range(3))
    assert abs(mean_coverage(quality, "ideal", dim=512, n=128, eps=1.0) - null) < 0.05


def test_warm_ldp_sums_carries_what_ldp_loses_at_epsilon_1(quality):
    warm = mean_coverage(quality, "sums-warm", dim=32, n=512, eps=1.0)
    assert warm >= 0.75 and warm > mean_coverage(quality, "ldp", dim=32, n=512, eps=1.0) + 0.2


def test_at_the_null_a_secret_quarter_of_four_times_the_rows_lifts_coverage_to_about_a_quarter(quality):
    assert mean_coverage(quality, "warm-q0.25", dim=512, n=128, eps=1.0) == pytest.approx(0.26, abs=0.03)


def test_the_secret_sample_of_a_quarter_lifts_coverage_at_the_same_epsilon(quality):
    assert mean_coverage(quality, "warm-q0.25", dim=512, n=512, eps=1.0) > (
        mean_coverage(quality, "sums-warm", dim=512, n=512, eps=1.0) + 0.2
    )
