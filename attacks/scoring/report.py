"""Per-vector scores into the figures of ``attack.json``: means with 95% intervals, null, advantage, chance."""

from __future__ import annotations

import math
import statistics
from typing import Any

from scipy import stats

#: Scores compared with the null reconstruction's (``null_<name>``, ``advantage_<name>``).
SCORES = (
    "psnr_source", "ssim_source",
    "psnr_best_member", "psnr_mean_member", "ssim_best_member", "ssim_mean_member",
    "psnr_best_client", "ssim_best_client",
    "reid",
)


def mean_interval(values: list[float]) -> tuple[float, list[float] | None]:
    """Mean and its 95% Student-t interval (None for fewer than two values)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, [mean - half, mean + half]


def wilson_interval(hits: list[float]) -> tuple[float, list[float]]:
    """Rate of 0/1 outcomes and its 95% Wilson interval (a t-interval collapses to a point at 0 or 1)."""
    result = stats.binomtest(int(sum(hits)), len(hits)).proportion_ci(confidence_level=0.95, method="wilson")
    return statistics.fmean(hits), [float(result.low), float(result.high)]


def summarize(rows: list[dict[str, float | None]]) -> dict[str, Any]:
    """The round's figures (docs/attacks.md, "Scores"); a score no row has (members unknown) is left out."""
    out: dict[str, Any] = {"vectors": len(rows)}
    for name in SCORES:
        pairs = [(s, n) for r in rows if (s := r.get(name)) is not None and (n := r.get(f"null_{name}")) is not None]
        if not pairs:
            continue
        label = "reid_rate" if name == "reid" else name
        interval = wilson_interval if name == "reid" else mean_interval
        out[label], out[f"{label}_ci95"] = interval([p for p, _ in pairs])
        out[f"n_{label}"] = len(pairs)
        out[f"null_{label}"], out[f"null_{label}_ci95"] = interval([n for _, n in pairs])
        out[f"advantage_{label}"], out[f"advantage_{label}_ci95"] = mean_interval([p - n for p, n in pairs])
    chances = [c for r in rows if (c := r.get("reid_chance")) is not None]
    if chances:
        out["reid_chance"] = statistics.fmean(chances)
    return out
