"""How many global centroids one hostile client takes, and how much honest coverage it costs, before and after the weight cap.

One round of the real global clustering (``privfed.orchestra.global_clustering``)
on synthetic data: unit vectors in ``--dim`` dimensions around ``--classes`` (10) class
directions, each client holding a label-skewed sample (Dirichlet ``--alpha``)
of ``--size`` images. Every honest client releases what the real ``kanon``
mechanism makes of its memory (``min(size, memory_size)`` rows). One hostile
client instead releases ``L`` unit vectors away from the honest data, in one
of two ways:

- ``spread``: ``L`` random directions;
- ``copies``: ``L`` copies of one random direction (at honest weight this
  is the strongest pull found: an equal-mass clustering must split a point
  mass over several centroids).

Its total weight is the largest the server accepts: **before** the cap, the
client's size (the old bound); **after**, what the real reply checks allow
(``ReplyRules.most_reps`` and ``kanon``'s ``max_total_weight``: the memory
size). ``after+median`` also scales every client down to the round's median
release weight (``median_client_cap``, the robust option).

Figures per setting, as mean ± std over the seeds:

- *taken*: global centroids whose nearest released vector is the hostile client's;
- *coverage*: mean, over every honest client's data, of the best cosine to a
  global centroid; *drop* is the clean round's coverage (the hostile client
  replaced by an honest one) minus this.

The round is warm-started from a clean round's centroids, as every round
after round 0 is (``--cold`` starts from k-means++ instead, as round 0 does).

    python benchmarks/client_influence.py                       # 10 and 50 clients, 5 seeds
    python benchmarks/client_influence.py --clients 10 --seeds 0 1 2 --cold
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mechanisms import create_mechanism, get_mechanism_class
from mechanisms.base import K_ANONYMITY, Guarantee, Release
from privfed.federation.reply_checks import ReplyRules
from privfed.orchestra.global_clustering import global_centroids

#: (clients, global centroids G, images per client): the CPU preset's round, and a cross-device-like one.
SETTINGS = {10: (16, 400), 50: (128, 2000)}


@dataclass(frozen=True)
class Federation:
    """One seed's synthetic clients: each one's data (``[n, D]`` unit rows)."""

    data: list[torch.Tensor]
    dim: int


def federation(
    num_clients: int, size: int, *, dim: int, classes: int, alpha: float, spread: float, generator: torch.Generator
) -> Federation:
    """Clients with label-skewed samples of ``classes`` class directions on the sphere."""
    directions = F.normalize(torch.randn(classes, dim, generator=generator), dim=1)
    mixtures = torch.distributions.Dirichlet(torch.full((classes,), alpha)).sample((num_clients,))
    data = []
    for mixture in mixtures:
        labels = torch.multinomial(mixture, size, replacement=True, generator=generator)
        noise = torch.randn(size, dim, generator=generator) * spread / dim**0.5
        data.append(F.normalize(directions[labels] + noise, dim=1))
    return Federation(data, dim)


def honest_release(data: torch.Tensor, *, memory_size: int, num_centroids: int, generator: torch.Generator) -> Release:
    """The real kanon release of a client's memory: its last ``memory_size`` rows (one per image)."""
    mechanism = create_mechanism("kanon", min_k=5)
    memory = data[torch.randperm(data.shape[0], generator=generator)[:memory_size]]
    return mechanism.release(memory, num_centroids=num_centroids, generator=generator)


def hostile_release(attack: str, weight: float, *, num_vectors: int, dim: int, generator: torch.Generator) -> Release:
    """``num_vectors`` unit vectors away from the data, totalling ``weight``, claiming an honest k."""
    if attack == "spread":
        vectors = F.normalize(torch.randn(num_vectors, dim, generator=generator), dim=1)
    elif attack == "copies":
        vectors = F.normalize(torch.randn(1, dim, generator=generator), dim=1).expand(num_vectors, dim).clone()
    else:
        raise ValueError(f"unknown attack {attack!r}")
    weights = torch.full((num_vectors,), weight / num_vectors)
    k = int(weight // num_vectors)
    return Release(vectors, weights, Guarantee(kind=K_ANONYMITY, statement="", k=k))


def accepted_weight(size: int, *, capped: bool, memory_size: int, num_centroids: int) -> float:
    """The heaviest release the server accepts from a client of ``size``: the size (before), or the real checks' bound."""
    if not capped:
        return float(size)
    rules = ReplyRules(
        client_sizes=(size,), dimension=0, num_centroids=num_centroids, mechanism=get_mechanism_class("kanon"),
        mechanism_params={"min_k": 5}, release_events=(), memory_size=memory_size,
    )
    return get_mechanism_class("kanon").max_total_weight(num_reps=rules.most_reps(size), params=rules.mechanism_params)


def coverage(centroids: torch.Tensor, honest: list[torch.Tensor]) -> float:
    """Mean best cosine of every honest row to a global centroid."""
    rows = torch.cat(honest)
    return float((rows @ centroids.T).max(dim=1).values.mean())


def taken(centroids: torch.Tensor, releases: list[Release], hostile: int) -> int:
    """Global centroids whose nearest released vector is the hostile client's."""
    vectors = torch.cat([r.vectors for r in releases])
    owner = torch.cat([torch.full((r.num_vectors,), i) for i, r in enumerate(releases)])
    nearest = (centroids @ vectors.T).argmax(dim=1)
    return int((owner[nearest] == hostile).sum())


def one_seed(num_clients: int, seed: int, args: argparse.Namespace) -> dict[str, tuple[int, float]]:
    """``{setting: (taken, coverage)}`` for one seed; the clean round's entry is ``"clean"``."""
    num_global, size = SETTINGS[num_clients]
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the Dirichlet mixtures
    fed = federation(
        num_clients, size, dim=args.dim, classes=args.classes, alpha=args.alpha, spread=args.spread, generator=generator
    )
    honest = [honest_release(d, memory_size=args.memory_size, num_centroids=args.local, generator=generator) for d in fed.data]
    hostile = num_clients - 1  # its honest data still counts for nothing: coverage is of the other clients'
    honest_data = fed.data[:hostile]

    def cluster(releases: list[Release], previous: torch.Tensor | None, median: bool = False) -> torch.Tensor:
        return global_centroids(
            releases, num_global, previous=previous, generator=torch.Generator().manual_seed(seed), median_client_cap=median
        )

    clean = cluster(honest, None)
    previous = None if args.cold else clean
    out = {"clean": (taken(clean, honest, hostile), coverage(clean, honest_data))}
    for attack in ("spread", "copies"):
        for label, capped, median in (("before", False, False), ("after", True, False), ("after+median", True, True)):
            weight = accepted_weight(size, capped=capped, memory_size=args.memory_size, num_centroids=args.local)
            bad = hostile_release(attack, weight, num_vectors=args.local, dim=args.dim, generator=torch.Generator().manual_seed(seed + 1))
            releases = [*honest[:hostile], bad]
            centroids = cluster(releases, previous, median)
            out[f"{attack} {label}"] = (taken(centroids, releases, hostile), coverage(centroids, honest_data))
        # The median cap without the weight cap: what it buys where a mechanism's weight bound is loose (ldp).
        weight = accepted_weight(size, capped=False, memory_size=args.memory_size, num_centroids=args.local)
        bad = hostile_release(attack, weight, num_vectors=args.local, dim=args.dim, generator=torch.Generator().manual_seed(seed + 1))
        centroids = cluster([*honest[:hostile], bad], previous, True)
        out[f"{attack} before+median"] = (taken(centroids, [*honest[:hostile], bad], hostile), coverage(centroids, honest_data))
    return out


def spread_of(values: list[float], fmt: str) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{format(statistics.fmean(values), fmt)} ± {format(std, fmt)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=sorted(SETTINGS), choices=sorted(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--classes", type=int, default=10, help="class directions (more than G: every centroid counts)")
    parser.add_argument("--memory-size", type=int, default=128)
    parser.add_argument("--local", type=int, default=8, help="L, local centroids per release")
    parser.add_argument("--alpha", type=float, default=0.1, help="Dirichlet label skew of each client")
    parser.add_argument("--spread", type=float, default=1.0, help="noise around each class direction")
    parser.add_argument("--cold", action="store_true", help="start the attacked round from k-means++, not a clean round's centroids")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (more are far slower on a busy machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for num_clients in args.clients:
        num_global, size = SETTINGS[num_clients]
        rows = [one_seed(num_clients, seed, args) for seed in args.seeds]
        clean = [r["clean"][1] for r in rows]
        print(
            f"\n1 hostile client among {num_clients} (G {num_global}, L {args.local}, size {size}, memory {args.memory_size}, "
            f"{args.classes} classes, "
            f"{'cold' if args.cold else 'warm'} start, seeds {args.seeds}); clean coverage {spread_of(clean, '.3f')}"
        )
        print(f"{'attack':<8} {'cap':<14} {'weight':>7} {'taken of G':>14} {'coverage':>15} {'drop':>15}")
        for name in rows[0]:
            if name == "clean":
                continue
            attack, cap = name.split(" ")
            weight = accepted_weight(size, capped=cap.startswith("after"), memory_size=args.memory_size, num_centroids=args.local)
            taken_counts = [float(r[name][0]) for r in rows]
            covered = [r[name][1] for r in rows]
            drops = [c - r[name][1] for c, r in zip(clean, rows)]
            print(
                f"{attack:<8} {cap:<14} {weight:>7.0f} {spread_of(taken_counts, '.1f'):>14} "
                f"{spread_of(covered, '.3f'):>15} {spread_of(drops, '.3f'):>15}",
                flush=True,
            )


if __name__ == "__main__":
    main()
