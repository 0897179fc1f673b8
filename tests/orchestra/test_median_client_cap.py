"""The robust option of the global clustering: no client's release outweighs the round's median release."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mechanisms.base import K_ANONYMITY, Guarantee, Release
from privfed.orchestra.global_clustering import global_centroids, median_capped_weights


def release(vectors: torch.Tensor, total: float) -> Release:
    weights = torch.full((vectors.shape[0],), total / vectors.shape[0])
    return Release(vectors, weights, Guarantee(kind=K_ANONYMITY, statement="", k=1))


def unit(n: int, dim: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=1)


def test_only_releases_above_the_median_are_scaled_down_to_it():
    releases = [release(unit(4, 8, s), total) for s, total in enumerate([64.0, 128.0, 128.0, 2000.0, 128.0])]
    totals = [float(w.sum()) for w in median_capped_weights(releases)]
    assert totals == [64.0, 128.0, 128.0, 128.0, 128.0]


def test_a_heavy_client_takes_no_more_centroids_than_a_typical_one():
    """Nine clients around one direction each; the tenth sends 8 far directions with 20 times their weight."""
    directions = unit(9, 16, 0)
    honest = [release(F.normalize(d + 0.05 * unit(8, 16, 10 + i), dim=1), 128.0) for i, d in enumerate(directions)]
    heavy = release(unit(8, 16, 99), 2560.0)

    def taken(median: bool) -> int:
        centroids = global_centroids([*honest, heavy], 16, previous=None, generator=torch.Generator().manual_seed(0),
                                     median_client_cap=median)
        vectors = torch.cat([r.vectors for r in [*honest, heavy]])
        nearest = (centroids @ vectors.T).argmax(dim=1)
        return int((nearest >= 9 * 8).sum())

    assert taken(median=False) > taken(median=True) and taken(median=True) <= 2
