"""How faithful one distributed-DP Lloyd step is: ``ddp-sums`` shares summed over K clients, on synthetic clusters.

K clients each hold 128 rows (or 512 images of which the secret sample keeps
a quarter) drawn from 8 of G clusters on the unit sphere. The previous
global centroids are the G true means turned to cosine 0.9. Each client
builds its per-cell table of sums and counts, adds its noise share
(:mod:`mechanisms.ddp_sums`), the shares are summed mod 2^32 and decoded,
and every cell whose noisy count passes 3 noise stds moves to its noisy sum
(:func:`mechanisms.ldp_sums.lloyd_step`).

**Fidelity** is the mass-weighted cosine between the noisy and the exact
update, both as moves from the previous centroids (a cell left in place
scores 0): 1 is the exact step, 0 a step that carries nothing.

The noise is calibrated like ``ldp-sums`` (:func:`mechanisms.ldp_sums.sums_noise_multiplier`)
for a total epsilon over 101 releases (a client sampled in every one of 100
rounds, round 0 included) at delta 1e-6, with ``K_min = K``. By default the
sum of the K shares' noise is drawn as one discrete Gaussian of their summed
variance (the two agree up to Kairouz et al.'s tau term, below 1e-30 at
these scales); ``--exact-shares`` builds and sums every client's real share.

    python benchmarks/ddp_fidelity.py            # 3 seeds, K 10/50/100/400, D 32 and 512, eps 1 and 10
    python benchmarks/ddp_fidelity.py --quick    # K 10 and 100, D 32
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
import zlib

import numpy as np
import torch
import torch.nn.functional as F

from mechanisms.ddp_sums import decode_table, share_sigma, table_share
from mechanisms.dp_pieces import clip_to_radius
from mechanisms.ldp_sums import (
    count_scale,
    integer_table,
    lloyd_step,
    nearest_cells,
    sums_grid,
    sums_noise_multiplier,
)
from mechanisms.noise import discrete_gaussian, poisson_sample_mask

MODULUS = 2**32
ROWS = 128
CLUSTERS_PER_CLIENT = 8
SPREAD = 0.88
WARM_COSINE = 0.9
RELEASES = 101
DELTA = 1e-6
SAMPLING_RATE = 0.25
THRESHOLD_STDS = 3.0
CELLS = {32: 64, 512: 128}


def generator(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF)


def unit(count: int, dim: int, gen: torch.Generator) -> torch.Tensor:
    return F.normalize(torch.randn(count, dim, generator=gen, dtype=torch.float64), dim=1)


def client_rows(means: torch.Tensor, rows: int, gen: torch.Generator) -> torch.Tensor:
    """``rows`` unit rows around ``CLUSTERS_PER_CLIENT`` of the means (a non-IID client)."""
    chosen = torch.randperm(means.shape[0], generator=gen)[:CLUSTERS_PER_CLIENT]
    labels = chosen[torch.randint(0, CLUSTERS_PER_CLIENT, (rows,), generator=gen)]
    noise = torch.randn(rows, means.shape[1], generator=gen, dtype=torch.float64) * SPREAD / math.sqrt(means.shape[1])
    return F.normalize(means[labels] + noise, dim=1)


def warm(means: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    away = torch.randn(means.shape, generator=gen, dtype=torch.float64)
    away = F.normalize(away - (away * means).sum(dim=1, keepdim=True) * means, dim=1)
    return WARM_COSINE * means + math.sqrt(1 - WARM_COSINE**2) * away


def exact_table(rows: torch.Tensor, centres: torch.Tensor, kept: np.ndarray | None) -> np.ndarray:
    """The client's noiseless table, flattened as its share is."""
    x = clip_to_radius(rows, 1.0)
    return integer_table(x, nearest_cells(x, centres), centres.shape[0], kept=kept).ravel()


def fidelity(previous: torch.Tensor, noisy: torch.Tensor, exact: torch.Tensor, mass: np.ndarray) -> float:
    """Mass-weighted cosine between the noisy and the exact moves away from ``previous``."""
    cos = F.cosine_similarity(noisy - previous, exact - previous, dim=1, eps=1e-12).numpy()
    return float((cos * mass).sum() / mass.sum())


def one_step(dim: int, clients: int, epsilon: float, sampled: bool, seed: int, exact_shares: bool) -> float:
    cells = CELLS[dim]
    means = unit(cells, dim, generator("means", dim, seed))
    previous = warm(means, generator("warm", dim, seed))
    rate = SAMPLING_RATE if sampled else 1.0
    z = sums_noise_multiplier(epsilon, DELTA, num_releases=RELEASES, sampling_rate=rate)
    sigma = share_sigma(z, min_shares=clients, dim=dim, sampled=sampled)
    held = round(ROWS / rate)
    exact_total = np.zeros(cells * (dim + 1), dtype=np.int64)
    noisy_total = np.zeros(cells * (dim + 1), dtype=np.int64)
    for k in range(clients):
        rows = client_rows(means, held, generator("rows", dim, seed, k))
        source = random.Random(zlib.crc32(repr(("noise", dim, seed, k, epsilon, sampled)).encode()))
        if exact_shares:
            replay = random.Random()
            replay.setstate(source.getstate())  # table_share draws its coins first: replay them for the exact table
            share = table_share(rows, previous, noise_multiplier=z, min_shares=clients, modulus=MODULUS,
                                sampling_rate=rate, source=source)
            noisy_total = np.mod(noisy_total + share, MODULUS)
            exact_total += exact_table(rows, previous, poisson_sample_mask(held, rate, source=replay) if sampled else None)
        else:
            kept = poisson_sample_mask(held, rate, source=source) if sampled else None
            exact_total += exact_table(rows, previous, kept)
    if not exact_shares:
        summed_noise = discrete_gaussian(exact_total.size, sigma=sigma * math.sqrt(clients), source=random.Random(seed))
        noisy_total = np.mod(exact_total + summed_noise, MODULUS)
    counts, sums = decode_table(noisy_total, num_cells=cells, dim=dim, modulus=MODULUS)
    exact_counts, exact_sums = decode_table(np.mod(exact_total, MODULUS), num_cells=cells, dim=dim, modulus=MODULUS)
    count_std = sigma * math.sqrt(clients) / count_scale(sums_grid(dim))
    noisy = lloyd_step(previous, counts, sums, threshold=THRESHOLD_STDS * count_std)
    exact = lloyd_step(previous, exact_counts, exact_sums, threshold=0.5)
    return fidelity(previous, noisy, exact, exact_counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="K 10 and 100, D 32")
    parser.add_argument("--exact-shares", action="store_true", help="sum every client's real share (slow at large K, D)")
    args = parser.parse_args()
    counts, dims = ((10, 100), (32,)) if args.quick else ((10, 50, 100, 400), (32, 512))
    start = time.perf_counter()
    print(f"fidelity of one Lloyd step (mean ± std over {args.seeds} seeds); total epsilon over {RELEASES} releases, "
          f"delta {DELTA:g}; {ROWS} rows per client ({SAMPLING_RATE:g} of {round(ROWS / SAMPLING_RATE)} images when sampled)")
    for dim in dims:
        print(f"\nD = {dim}, G = {CELLS[dim]}")
        print(f"{'K':>5} {'eps':>4} {'plain':>12} {'sampled':>12}")
        for clients in counts:
            for epsilon in (1.0, 10.0):
                cells = []
                for sampled in (False, True):
                    values = [one_step(dim, clients, epsilon, sampled, seed, args.exact_shares) for seed in range(args.seeds)]
                    spread = statistics.stdev(values) if len(values) > 1 else 0.0
                    cells.append(f"{statistics.fmean(values):.2f}±{spread:.2f}")
                print(f"{clients:>5} {epsilon:>4g} {cells[0]:>12} {cells[1]:>12}", flush=True)
        print(f"[{time.perf_counter() - start:.0f}s elapsed]")


if __name__ == "__main__":
    main()
