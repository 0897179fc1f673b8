"""Means, intervals, nulls, advantages and chance levels in attack.json."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from attacks.scoring.report import mean_interval, summarize


def test_the_interval_is_students_t_over_the_vectors():
    mean, (lo, hi) = mean_interval([1.0, 2.0, 3.0])
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert mean == 2.0 and lo == pytest.approx(2 - half) and hi == pytest.approx(2 + half)
    assert mean_interval([4.0]) == (4.0, None)


def test_summary_pairs_each_score_with_its_null_and_leaves_out_unknown_members():
    rows = [
        {"psnr_source": 20.0, "null_psnr_source": 12.0, "reid": 1.0, "null_reid": 0.0, "reid_chance": 0.01,
         "psnr_best_client": 21.0, "null_psnr_best_client": 15.0},
        {"psnr_source": 16.0, "null_psnr_source": 13.0, "reid": 0.0, "null_reid": 0.0, "reid_chance": 0.03,
         "psnr_best_client": 17.0, "null_psnr_best_client": 14.0},
    ]
    out = summarize(rows)
    assert out["vectors"] == 2
    assert out["psnr_source"] == 18.0 and out["null_psnr_source"] == 12.5 and out["advantage_psnr_source"] == 5.5
    assert out["reid_rate"] == 0.5 and out["null_reid_rate"] == 0.0 and out["reid_chance"] == pytest.approx(0.02)
    assert out["advantage_psnr_best_client"] == 4.5 and out["advantage_psnr_best_client_ci95"] is not None
    assert "psnr_best_member" not in out and "ssim_source" not in out
    assert out["n_psnr_source"] == 2 and out["n_reid_rate"] == 2
    low, high = out["null_psnr_source_ci95"]  # the null's own spread: 12 and 13 give a t-interval around 12.5
    assert low < 12.0 and high > 13.0 and (low + high) / 2 == pytest.approx(12.5)
    assert out["null_reid_rate_ci95"][0] == pytest.approx(0.0, abs=1e-12)  # Wilson for the null's rate too


def test_a_rate_of_zero_still_has_an_interval_above_zero():
    rows = [{"reid": 0.0, "null_reid": 0.0, "reid_chance": 0.01} for _ in range(60)]
    out = summarize(rows)
    low, high = out["reid_rate_ci95"]
    assert out["reid_rate"] == 0.0 and low == pytest.approx(0.0, abs=1e-12) and 0.03 < high < 0.1  # Wilson: ~0.06
