"""Many rounds of the summed-table DP centroids: which server momentum and release cadence, on synthetic clusters.

``benchmarks/ddp_fidelity.py`` scores one Lloyd step from warm centroids. A
run is many steps from random ones, and two cheap knobs were never tuned: the
server's EMA ``momentum`` (:func:`mechanisms.ldp_sums.lloyd_step`; 0.5 before
these figures, 0.75 since) and a release cadence ``k`` (``--release-every``):
clients release, and are charged, only in every k-th round (here rounds 0, k,
2k, ... of R; privfed's training rounds 1, 1 + k, ...), so the total budget is
spread over ``ceil(R / k)`` releases; in the other rounds the centroids stay.

The ``ldp-sums-summed`` model is what ``ldp-sums``'s server now does: it adds
the round's noisy tables (:meth:`mechanisms.ldp_sums.LdpSumsMechanism.combine_tables`).

The data are static. G true means are random unit vectors in D dimensions;
each of N clients holds unit rows around 8 of them (non-IID), its row count
spread geometrically from the smallest to the median and from the median to
the largest size. Each round K clients are drawn uniformly. In a release
round each of them builds its integer table over the current global centroids
(:func:`mechanisms.ldp_sums.integer_table`: rows clipped, rounded to the grid,
summed per nearest cell with their counts), on a secret Poisson sample of
rate ``q = min(1, memory / median size)`` (the run's rule), and the server
takes one :func:`~mechanisms.ldp_sums.lloyd_step` from the sum of the K
tables, moving the cells whose noisy count reaches the server's
:func:`~mechanisms.ldp_sums.step_threshold` (one noise std, at least a row).

Noise. ``z = sums_noise_multiplier(total epsilon, delta, ceil(R / k) releases,
q)``: every client is charged as if it were drawn in every release round.
Per table entry and client the noise std is ``z * unit`` grid units (``unit``
the row bound of :mod:`mechanisms.ldp_sums`, sampled or not), so the round's
summed table carries

* ``ldp-sums-summed``: variance ``K (z unit)^2`` (each client adds the whole
  noise and the server adds the K noisy tables);
* ``ddp-sums``: variance ``(z unit)^2`` (shares inside a secure sum,
  ``K_min = K``; the CPU preset's runs take ``K_min`` 6 of 10, so more noise).

The summed noise is drawn as one continuous Gaussian of that variance (numpy,
seeded), not as K discrete-Gaussian shares: what the server's step sees has
the same variance, and a benchmark needs no secure randomness. ``noiseless``
is the same run on exact tables (threshold 1): the ceiling for that cadence
and momentum.

**Centroid cosine**: the mean over all clients' rows (every row held, not the
sample) of the cosine to the nearest global centroid after the round,
averaged over the last 5 rounds, as the CPU preset's figure is; ``random
centroids`` (the start of every run) is the floor. Mean ± sample std over
seeds; the runs of a seed share the data, the start, the drawn clients and
their samples.

Scales. ``cpu``: the CPU preset (D 32, G 16, N 20, K 10, R 20 rounds, 29 to
585 images per client, median 250, memory 128, so q 0.51). ``paper`` is
shrunk to fit the time (the paper's D 512, G 128, N 500, K 100, R 100 with
100 rows each would take over 20 min on one core): R 40 rounds and K 64 of
N 320 clients, 100 rows each, q 1. Since ``z`` grows as the square root of the
releases, ``ddp-sums``' per-release count signal-to-noise, ``K / z``, is that
of the paper's run (64 / sqrt(40) against 100 / sqrt(100)), and
``ldp-sums-summed``'s ``sqrt(K) / z`` is 1.26 times it; the horizon is 40
rounds, not 100.

    OMP_NUM_THREADS=1 python benchmarks/dp_centroid_rounds.py            # both scales, the full grid (about 7 min)
    OMP_NUM_THREADS=1 python benchmarks/dp_centroid_rounds.py --quick    # cpu scale, momentum 0/0.5/0.9, k 1 and 5
    OMP_NUM_THREADS=1 python benchmarks/dp_centroid_rounds.py --scale paper
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from mechanisms.ddp_sums import share_sigma
from mechanisms.dp_pieces import clip_to_radius
from mechanisms.ldp_sums import (
    DEFAULT_MOMENTUM,
    count_scale,
    integer_table,
    lloyd_step,
    nearest_cells,
    step_threshold,
    sums_grid,
    sums_noise_multiplier,
    table_in_data_units,
)
from mechanisms.noise import poisson_sample_mask

MODELS = ("ldp-sums-summed", "ddp-sums")
MOMENTA = (0.0, 0.25, 0.5, 0.75, 0.9)
CADENCES = (1, 2, 5)
EPSILONS = (1.0, 10.0)
DELTA = 1e-3
CLUSTERS_PER_CLIENT = 8
#: Per-coordinate spread of a row around its mean, times sqrt(D): a row's cosine to its mean is about 0.75.
SPREAD = 0.88
#: Rounds the centroid cosine is averaged over, at the end of the run.
TAIL = 5


@dataclass(frozen=True)
class Scale:
    """One run's shape; ``memory`` 0: no secret sample."""

    name: str
    dim: int
    clusters: int
    clients: int
    per_round: int
    rounds: int
    smallest: int
    median: int
    largest: int
    memory: int = 0

    def sizes(self) -> list[int]:
        """Rows per client: geometric from the smallest to the median, and from the median to the largest."""
        low = self.clients // 2
        below = np.geomspace(self.smallest, self.median, low) if low else np.zeros(0)
        above = np.geomspace(self.median, self.largest, self.clients - low)
        return [round(float(v)) for v in np.concatenate([below, above])]

    @property
    def sampling_rate(self) -> float:
        """What keeps ``memory`` rows of the median client, at most 1 (``PlanRequest.secret_sample_rate``)."""
        if not self.memory:
            return 1.0
        return min(1.0, self.memory / max(statistics.median(self.sizes()), 1))

    def describe(self) -> str:
        sizes = self.sizes()
        rows = f"{sizes[0]} rows each" if min(sizes) == max(sizes) else (
            f"{min(sizes)} to {max(sizes)} rows, median {statistics.median(sizes):g}")
        return (f"{self.name}: D {self.dim}, G {self.clusters}, N {self.clients}, K {self.per_round}, "
                f"R {self.rounds}, {rows}, q {self.sampling_rate:.3g}")


SCALES = {
    "cpu": Scale("cpu", dim=32, clusters=16, clients=20, per_round=10, rounds=20, smallest=29, median=250,
                 largest=585, memory=128),
    "paper": Scale("paper", dim=512, clusters=128, clients=320, per_round=64, rounds=40, smallest=100, median=100,
                   largest=100),
}


def seed_of(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def unit_rows(count: int, dim: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(count, dim, generator=gen, dtype=torch.float64), dim=1)


@dataclass(frozen=True)
class Population:
    """A seed's data: the true means, each client's rows (clipped, as its table reads them), all rows for the metric,
    and the random centroids every run starts from."""

    means: torch.Tensor
    rows: list[torch.Tensor]
    everyone: torch.Tensor
    start: torch.Tensor


def population(scale: Scale, seed: int) -> Population:
    means = unit_rows(scale.clusters, scale.dim, seed_of("means", scale, seed))
    gen = torch.Generator().manual_seed(seed_of("rows", scale, seed))
    rows = []
    for size in scale.sizes():
        chosen = torch.randperm(scale.clusters, generator=gen)[:CLUSTERS_PER_CLIENT]
        labels = chosen[torch.randint(0, chosen.numel(), (size,), generator=gen)]
        noise = torch.randn(size, scale.dim, generator=gen, dtype=torch.float64) * SPREAD / math.sqrt(scale.dim)
        rows.append(clip_to_radius(F.normalize(means[labels] + noise, dim=1), 1.0))
    start = unit_rows(scale.clusters, scale.dim, seed_of("start", scale, seed))
    return Population(means=means, rows=rows, everyone=torch.cat(rows).float(), start=start)


def centroid_cosine(everyone: torch.Tensor, centroids: torch.Tensor) -> float:
    """Mean cosine of each (unit) row to its nearest centroid (float32: a score, not a release)."""
    return float((everyone @ F.normalize(centroids.float(), dim=1).T).max(dim=1).values.mean())


def num_releases(rounds: int, cadence: int) -> int:
    """Release rounds 0, k, 2k, ... below ``rounds``: what a client drawn in each of them is charged for."""
    return math.ceil(rounds / cadence)


def summed_noise_std(model: str, noise_multiplier: float, *, clients: int, dim: int, sampled: bool) -> float:
    """Std per entry of the round's summed table, in grid units, for ``clients`` tables of one release each."""
    if model == "ldp-sums-summed":  # K tables, each with the whole noise
        return share_sigma(noise_multiplier, min_shares=1, dim=dim, sampled=sampled) * math.sqrt(clients)
    if model == "ddp-sums":  # K shares that add up to one release's noise
        return share_sigma(noise_multiplier, min_shares=clients, dim=dim, sampled=sampled) * math.sqrt(clients)
    raise ValueError(f"unknown noise model {model!r}")


def round_noise(scale: Scale, model: str | None, epsilon: float, cadence: int) -> tuple[float, float]:
    """A release round's summed noise std (grid units) and the count a cell needs to move (rows); None: no noise."""
    std = 0.0
    if model is not None:
        q = scale.sampling_rate
        z = sums_noise_multiplier(epsilon, DELTA, num_releases=num_releases(scale.rounds, cadence), sampling_rate=q)
        std = summed_noise_std(model, z, clients=scale.per_round, dim=scale.dim, sampled=q < 1)
    return std, step_threshold(std / count_scale(sums_grid(scale.dim)))


@dataclass
class Trace:
    """One run: its release rounds, the cells each round moved, and the centroid cosine of its last rounds."""

    releases: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    tail: list[float] = field(default_factory=list)

    @property
    def cosine(self) -> float:
        return statistics.fmean(self.tail)


def run(
    scale: Scale, data: Population, seed: int, *, model: str | None, epsilon: float, cadence: int, momentum: float
) -> Trace:
    """One run from ``data.start``; ``model`` None: exact tables (``epsilon`` unused)."""
    q = scale.sampling_rate
    std, threshold = round_noise(scale, model, epsilon, cadence)
    noise = np.random.default_rng(seed_of("noise", scale, seed, model, epsilon, cadence, momentum))
    centroids = data.start.clone()
    trace = Trace()
    for r in range(scale.rounds):
        drawn = random.Random(seed_of("draw", scale, seed, r)).sample(range(scale.clients), scale.per_round)
        before = centroids
        if r % cadence == 0:
            trace.releases.append(r)
            table = np.zeros((scale.clusters, scale.dim + 1), dtype=np.int64)
            for c in drawn:
                x = data.rows[c]
                kept = None
                if q < 1:  # the same secret sample of this client and round in every run of the seed
                    kept = poisson_sample_mask(x.shape[0], q, source=random.Random(seed_of("sample", seed, r, c)))
                table += integer_table(x, nearest_cells(x, centroids), scale.clusters, kept=kept)
            noisy = table + noise.normal(0.0, std, table.shape) if std else table
            counts, sums = table_in_data_units(noisy)
            centroids = lloyd_step(centroids, counts, sums, threshold=threshold, momentum=momentum)
        trace.moved.append(int((centroids != before).any(dim=1).sum()))
        if r >= scale.rounds - TAIL:
            trace.tail.append(centroid_cosine(data.everyone, centroids))
    return trace


def summary(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f}±{spread:.3f}"


def run_scale(scale: Scale, *, seeds: int, momenta: tuple[float, ...], cadences: tuple[int, ...],
              epsilons: tuple[float, ...]) -> None:
    start = time.perf_counter()
    results: dict[tuple[str, float, int, float], list[float]] = defaultdict(list)
    floor: list[float] = []
    for seed in range(seeds):
        data = population(scale, seed)
        floor.append(centroid_cosine(data.everyone, data.start))
        for cadence in cadences:
            for momentum in momenta:
                exact = run(scale, data, seed, model=None, epsilon=0.0, cadence=cadence, momentum=momentum)
                results["noiseless", 0.0, cadence, momentum].append(exact.cosine)
                for epsilon in epsilons:
                    for model in MODELS:
                        trace = run(scale, data, seed, model=model, epsilon=epsilon, cadence=cadence, momentum=momentum)
                        results[model, epsilon, cadence, momentum].append(trace.cosine)
        print(f"[{scale.name} seed {seed} done, {time.perf_counter() - start:.0f}s]", flush=True)
    q = scale.sampling_rate
    for epsilon in epsilons:
        print(f"\n{scale.describe()}; total epsilon {epsilon:g}, delta {DELTA:g}; centroid cosine over the last "
              f"{TAIL} rounds, mean ± std over {seeds} seeds")
        print(f"{'model':<16} {'k':>2} {'rel':>3} {'z':>6} " + " ".join(f"{'m ' + format(m, 'g'):>11}" for m in momenta))
        for model in (*MODELS, "noiseless"):
            for cadence in cadences:
                releases = num_releases(scale.rounds, cadence)
                z = "–" if model == "noiseless" else f"{sums_noise_multiplier(epsilon, DELTA, num_releases=releases, sampling_rate=q):.2f}"
                key_eps = 0.0 if model == "noiseless" else epsilon
                cells = " ".join(f"{summary(results[model, key_eps, cadence, m]):>11}" for m in momenta)
                print(f"{model:<16} {cadence:>2} {releases:>3} {z:>6} {cells}")
        print(f"random centroids (floor): {summary(floor)}")
        best = []
        for model in MODELS:
            cadence, momentum = max(((k, m) for k in cadences for m in momenta),
                                    key=lambda km: statistics.fmean(results[model, epsilon, km[0], km[1]]))
            line = f"{model} m {momentum:g}, k {cadence} ({summary(results[model, epsilon, cadence, momentum])})"
            if 1 in cadences and DEFAULT_MOMENTUM in momenta:
                line += f" vs default m {DEFAULT_MOMENTUM:g}, k 1 ({summary(results[model, epsilon, 1, DEFAULT_MOMENTUM])})"
            best.append(line)
        print(f"best at epsilon {epsilon:g}: " + "; ".join(best))
    print(f"[{scale.name}: {time.perf_counter() - start:.0f}s]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=(*SCALES, "both"), default="both")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="cpu scale, momentum 0/0.5/0.9, k 1 and 5")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = list(SCALES) if args.scale == "both" else [args.scale]
    momenta: tuple[float, ...] = MOMENTA
    cadences: tuple[int, ...] = CADENCES
    if args.quick:
        names, momenta, cadences = ["cpu"], (0.0, 0.5, 0.9), (1, 5)
    for name in names:
        run_scale(SCALES[name], seeds=args.seeds, momenta=momenta, cadences=cadences, epsilons=EPSILONS)


if __name__ == "__main__":
    main()
