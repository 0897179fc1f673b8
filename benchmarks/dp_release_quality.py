"""How much signal one differentially private release carries: coverage of the true clusters on synthetic data.

One client holds rows from 8 clusters on the unit sphere (cluster means are
random unit vectors; a row is ``normalise(mean + SPREAD * g / sqrt(D))`` with
``g`` standard normal, so its cosine to its own mean is about 0.75; the
header prints the measured value). The rows are drawn equally from the
clusters (``n / 8`` each). Every mechanism releases L = 8 vectors once, and
the release is scored by its **coverage**: for each true cluster mean, the
best cosine to the release's non-padding vectors (weight > 0), averaged over
the clusters. A release with no non-padding vector scores as the **null**:
the expected coverage of L random unit vectors (a server with nothing falls
back to random directions), estimated by Monte Carlo for each seed's means.

Rows of each table (columns, one per mechanism):

* ``ldp``: the SimHash-tree coreset at the per-release epsilon;
* ``sums-warm``: ``ldp-sums`` over G = 16 public partition centres, the 8
  true means each turned to cosine 0.9 with the truth plus 8 random unit
  vectors (optimistic: it assumes earlier rounds already found the clusters);
* ``sums-cold``: ``ldp-sums`` with no centres (round 0: L random centres);
* ``warm-q0.25`` and ``cold-q0.25``: the same two with ``sampling_rate=0.25``:
  the client holds ``n / 0.25`` rows and the mechanism draws its own secret
  Poisson sample (about ``n`` rows), calibrated to the same per-release
  epsilon with the amplification counted;
* ``ideal`` and ``ideal-q0.25``: ``ldp-sums`` whose partition is the 8 true
  means (it knows the clusters), same epsilon, without and with the sample:
  the most a noisy per-cell sum of those rows can give;
* ``kanon``: k-anonymous centroids (not DP), a reference;
* ``null``: L random unit vectors.

``kanon`` and ``null`` do not depend on epsilon or delta (computed once per
D and n). Cells are mean ± sample std over seeds; a second table gives the
mean fraction of the L released vectors that are not padding.

    python benchmarks/dp_release_quality.py            # full grid, 3 seeds
    python benchmarks/dp_release_quality.py --quick    # D 32 and 512, n 512, eps 1 and 10, delta 1e-3

Coverage near the null means the release carries nothing about the clusters;
near 1 it points at every cluster. Below the null: the release kept fewer than
L vectors, mostly noise (fewer random directions cover less than L do).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mechanisms import Mechanism, Release, create_mechanism

NUM_CLUSTERS = 8
NUM_CENTROIDS = 8
#: Norm of a row's noise before normalising: cosine to its mean about 1 / sqrt(1 + SPREAD**2) = 0.75.
SPREAD = 0.88
#: Cosine of each warm partition centre to its true mean.
WARM_COSINE = 0.9
#: Random unit vectors added to the warm partition (G = 8 + 8 = 16 centres).
WARM_EXTRA = 8
SAMPLING_RATE = 0.25
#: Draws of L random vectors behind each seed's null coverage.
NULL_DRAWS = 256

DIMS = (32, 512)
SIZES = (128, 512, 2048)
EPSILONS = (0.8, 1.0, 10.0)
DELTAS = (1e-3, 1e-6)
DP_COLUMNS = ("ldp", "sums-warm", "warm-q0.25", "sums-cold", "cold-q0.25", "ideal", "ideal-q0.25")
COLUMNS = (*DP_COLUMNS, "kanon", "null")


@dataclass(frozen=True)
class Score:
    """One release's coverage and the fraction of its L vectors that are not padding."""

    coverage: float
    fraction: float


def seed_of(*parts: object) -> int:
    """A stable 31-bit seed for one named draw, so no two draws share a stream and reruns repeat."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def generator(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(seed_of(*parts))


def unit_vectors(count: int, dim: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` directions uniform on the sphere."""
    return F.normalize(torch.randn(count, dim, generator=gen, dtype=torch.float64), dim=1)


def clustered_rows(means: torch.Tensor, rows: int, gen: torch.Generator) -> torch.Tensor:
    """``rows`` unit rows, an equal share (``rows / clusters``, rounded down) around each mean."""
    per = rows // means.shape[0]
    centre = means.repeat_interleave(per, dim=0)
    noise = torch.randn(centre.shape, generator=gen, dtype=torch.float64) * (SPREAD / math.sqrt(means.shape[1]))
    return F.normalize(centre + noise, dim=1)


def perturbed(means: torch.Tensor, cosine: float, gen: torch.Generator) -> torch.Tensor:
    """Each mean turned to exactly ``cosine`` with itself, towards a random orthogonal direction."""
    away = torch.randn(means.shape, generator=gen, dtype=torch.float64)
    away = F.normalize(away - (away * means).sum(dim=1, keepdim=True) * means, dim=1)
    return cosine * means + math.sqrt(1.0 - cosine**2) * away


def coverage(means: torch.Tensor, vectors: torch.Tensor) -> float:
    """Mean over the true means of the best cosine to any of ``vectors`` (at least one)."""
    return float((means @ F.normalize(vectors.double(), dim=1).T).max(dim=1).values.mean())


def own_mean_cosine(client: Client) -> float:
    """Mean cosine of a row to its own cluster's mean: how tight the clusters are."""
    means = client.means.repeat_interleave(client.rows.shape[0] // NUM_CLUSTERS, dim=0)
    return float((client.rows * means).sum(dim=1).mean())


def null_coverage(means: torch.Tensor, seed: int) -> float:
    """Expected coverage of L random unit vectors: what a server with nothing gets."""
    gen = generator("null", means.shape[1], seed)
    draws = [coverage(means, unit_vectors(NUM_CENTROIDS, means.shape[1], gen)) for _ in range(NULL_DRAWS)]
    return statistics.fmean(draws)


def score(release: Release, means: torch.Tensor, null: float) -> Score:
    """Coverage of the non-padding vectors; the null when there are none."""
    real = release.vectors[release.weights > 0]
    value = coverage(means, real) if real.shape[0] else null
    return Score(coverage=value, fraction=real.shape[0] / NUM_CENTROIDS)


def released(mechanism: Mechanism, rows: torch.Tensor, gen: torch.Generator) -> Release:
    return mechanism.release(rows.float(), num_centroids=NUM_CENTROIDS, generator=gen)


@dataclass(frozen=True)
class Client:
    """One seed's data at one (D, n): the truth, the rows, the warm partition and the null."""

    seed: int
    means: torch.Tensor
    rows: torch.Tensor
    large_rows: torch.Tensor  # n / SAMPLING_RATE rows, for the secret-sample column
    warm: torch.Tensor
    null: float


def make_client(dim: int, n: int, seed: int) -> Client:
    """The means and warm centres depend on (D, seed) only, so they are shared across n."""
    means = unit_vectors(NUM_CLUSTERS, dim, generator("means", dim, seed))
    warm = torch.cat(
        [
            perturbed(means, WARM_COSINE, generator("warm", dim, seed)),
            unit_vectors(WARM_EXTRA, dim, generator("extra", dim, seed)),
        ]
    )
    return Client(
        seed=seed,
        means=means,
        rows=clustered_rows(means, n, generator("rows", dim, n, seed)),
        large_rows=clustered_rows(means, round(n / SAMPLING_RATE), generator("large", dim, n, seed)),
        warm=warm,
        null=null_coverage(means, seed),
    )


def dp_release(
    name: str,
    rows: torch.Tensor,
    centres: torch.Tensor | None,
    *,
    eps: float,
    delta: float,
    key: tuple[object, ...],
    **extra: float,
) -> Release:
    """One release of a DP mechanism built from (epsilon, delta), seeded by ``key`` (noise and generator)."""
    mechanism = create_mechanism(
        name, epsilon=eps, delta=delta, noise_source=random.Random(seed_of("noise", *key)), **extra
    )
    if centres is not None:
        mechanism.observe_global_centroids(centres)
    return released(mechanism, rows, generator("release", *key))


def dp_scores(client: Client, eps: float, delta: float) -> dict[str, Score]:
    """The DP columns for one client at one (epsilon, delta)."""
    dim, n = client.means.shape[1], client.rows.shape[0]
    # column -> (mechanism, rows, partition centres, extra constructor arguments)
    settings: dict[str, tuple[str, torch.Tensor, torch.Tensor | None, dict[str, float]]] = {
        "ldp": ("ldp", client.rows, None, {}),
        "sums-warm": ("ldp-sums", client.rows, client.warm, {}),
        "sums-cold": ("ldp-sums", client.rows, None, {}),
        "ideal": ("ldp-sums", client.rows, client.means, {}),
    }
    sample = {"sampling_rate": SAMPLING_RATE}
    settings[f"warm-q{SAMPLING_RATE:g}"] = ("ldp-sums", client.large_rows, client.warm, sample)
    settings[f"cold-q{SAMPLING_RATE:g}"] = ("ldp-sums", client.large_rows, None, sample)
    settings[f"ideal-q{SAMPLING_RATE:g}"] = ("ldp-sums", client.large_rows, client.means, sample)
    scores = {}
    for column, (name, rows, centres, extra) in settings.items():
        release = dp_release(
            name, rows, centres, eps=eps, delta=delta, key=(column, client.seed, dim, n, eps, delta), **extra
        )
        scores[column] = score(release, client.means, client.null)
    return scores


def fixed_scores(client: Client) -> dict[str, Score]:
    """The columns that do not depend on epsilon or delta: kanon (not DP) and the null."""
    kanon = released(create_mechanism("kanon"), client.rows, generator("kanon", client.seed, *client.rows.shape))
    return {"kanon": score(kanon, client.means, client.null), "null": Score(client.null, 0.0)}


def spread(values: list[float]) -> str:
    """``mean±std`` over seeds (sample std)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f}±{std:.2f}"


def cell(scores: list[Score] | None, fraction: bool) -> str:
    if not scores:
        return "-"
    return f"{statistics.fmean(s.fraction for s in scores):.2f}" if fraction else spread([s.coverage for s in scores])


def print_table(
    title: str, results: dict[tuple[int, float], dict[str, list[Score]]], columns: tuple[str, ...], *, fraction: bool
) -> None:
    width = 10
    print(title)
    print(f"{'n':>5} {'eps':>4} " + " ".join(f"{c:>{width}}" for c in columns))
    for (n, eps), row in sorted(results.items()):
        print(f"{n:>5} {eps:>4g} " + " ".join(f"{cell(row.get(c), fraction):>{width}}" for c in columns))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per cell (default 3)")
    parser.add_argument("--quick", action="store_true", help="D 32 and 512, n 512, eps 1 and 10, delta 1e-3")
    args = parser.parse_args()
    sizes, epsilons, deltas = ((512,), (1.0, 10.0), (1e-3,)) if args.quick else (SIZES, EPSILONS, DELTAS)
    start = time.perf_counter()
    print(
        f"coverage = mean over {NUM_CLUSTERS} true cluster means of the best cosine to a non-padding released vector; "
        f"L = {NUM_CENTROIDS}; one release per client; {args.seeds} seeds, mean±std"
    )
    print(
        f"data: rows = normalise(mean + {SPREAD} g / sqrt(D)), n / {NUM_CLUSTERS} per cluster (equal shares); "
        f"sums-warm: G = {NUM_CLUSTERS + WARM_EXTRA} centres = the true means at cosine {WARM_COSINE} "
        f"+ {WARM_EXTRA} random (optimistic); ideal: partition = the true means"
    )
    print()
    for dim in DIMS:
        clients = {n: [make_client(dim, n, seed) for seed in range(args.seeds)] for n in sizes}
        cos_to_mean = statistics.fmean(own_mean_cosine(c) for cs in clients.values() for c in cs)
        nulls = [c.null for c in clients[sizes[0]]]
        fixed = {n: [fixed_scores(c) for c in cs] for n, cs in clients.items()}
        for delta in deltas:
            results: dict[tuple[int, float], dict[str, list[Score]]] = {}
            for n in sizes:
                for eps in epsilons:
                    per_seed = [dp_scores(c, eps, delta) for c in clients[n]]
                    row = {col: [s[col] for s in per_seed if col in s] for col in DP_COLUMNS}
                    row.update({col: [s[col] for s in fixed[n]] for col in ("kanon", "null")})
                    results[(n, eps)] = row
            header = (
                f"D = {dim}, delta = {delta:g} (row cosine to its own mean {cos_to_mean:.3f}; "
                f"null {statistics.fmean(nulls):.3f})"
            )
            print_table(f"{header}: coverage", results, COLUMNS, fraction=False)
            print_table(f"{header}: fraction of the L vectors not padding", results, COLUMNS[:-1], fraction=True)
            print(f"[{time.perf_counter() - start:.0f}s elapsed]", flush=True)
            print()


if __name__ == "__main__":
    main()
