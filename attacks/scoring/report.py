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


def summarize(rows: list[dict[str, float | None]]) -> dict[str, Any]:
    """The round's figures over its attacked vectors.

    For each score ``s`` present: ``s`` (mean), ``s_ci95``, ``null_s``,
    ``advantage_s`` (mean of ``s - null_s`` per vector) and
    ``advantage_s_ci95``; re-identification is reported as ``reid_rate`` and
    ``reid_chance`` (the rate a random ranking would hit). A score absent from
    every row (members unknown) is left out.
    """
    out: dict[str, Any] = {"vectors": len(rows)}
    for name in SCORES:
        pairs = [(r[name], r[f"null_{name}"]) for r in rows if r.get(name) is not None]
        if not pairs:
            continue
        label = "reid_rate" if name == "reid" else name
        out[label], out[f"{label}_ci95"] = mean_interval([p for p, _ in pairs])
        out[f"null_{label}"] = statistics.fmean(n for _, n in pairs)
        out[f"advantage_{label}"], out[f"advantage_{label}_ci95"] = mean_interval([p - n for p, n in pairs])
    chances = [r["reid_chance"] for r in rows if r.get("reid_chance") is not None]
    if chances:
        out["reid_chance"] = statistics.fmean(chances)
    return out
