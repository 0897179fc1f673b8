"""Each mechanism's account of which rows fed which released vector (used only to score attacks)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mechanisms import create_mechanism
from mechanisms.base import checked_release_with_members


def unit_rows(n: int, dim: int = 8, seed: int = 0) -> torch.Tensor:
    return F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=1)


def release(name: str, reps: torch.Tensor, **params):
    return checked_release_with_members(
        create_mechanism(name, **params), reps, num_centroids=4, generator=torch.Generator().manual_seed(1)
    )


def test_reps_rows_are_their_own_vectors():
    reps = unit_rows(10)
    out, members = release("reps", reps)
    assert members.tolist() == list(range(10)) and torch.equal(out.vectors, reps)


def test_each_kanon_centroid_is_the_normalised_mean_of_its_members():
    reps = unit_rows(40)
    out, members = release("kanon", reps, min_k=5)
    for j in range(out.num_vectors):
        mine = reps[members == j]
        assert mine.shape[0] == int(out.weights[j]) >= 5
        assert torch.allclose(out.vectors[j], F.normalize(mine.mean(dim=0), dim=0), atol=1e-5)
    assert release("kanon", unit_rows(4), min_k=5)[1].tolist() == [-1] * 4  # too few rows: nothing released


def test_ldp_members_point_only_at_centres_that_carry_weight():
    reps = torch.cat([unit_rows(1, seed=s).repeat(300, 1) for s in range(2)])  # two tight clusters of 300
    out, members = release("ldp", reps, epsilon=20.0, delta=1e-6)
    named = members[members >= 0].unique()
    assert named.numel() >= 1 and bool((out.weights[named] > 0).all())
    for j in named.tolist():  # a centre's members lie near it
        assert float((reps[members == j] @ out.vectors[j].float()).mean()) > 0.5
