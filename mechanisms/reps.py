"""No privacy: the client releases its representations themselves.

This is the paper's "idealised" setting and the attack baseline: the server
clusters every raw representation directly, so whatever an inversion attack
recovers here is the most any mechanism could leak.
"""

from __future__ import annotations

import torch

from mechanisms.base import NO_GUARANTEE, Guarantee, Release, ReleaseMechanism
from mechanisms.registry import register_mechanism


@register_mechanism
class RawRepresentations(ReleaseMechanism):
    """Releases its input unchanged, one unit of weight per representation."""

    name = "reps"
    description = "no privacy: releases the representations themselves"
    guarantee_kind = NO_GUARANTEE
    releases_raw_data = True

    def guarantee(self, *, num_reps: int, num_centroids: int) -> Guarantee:
        return Guarantee(
            kind=NO_GUARANTEE,
            statement=f"No protection: all {num_reps} representations are released as they are.",
        )

    @classmethod
    def max_vectors(cls, *, num_reps: int, num_centroids: int) -> int:
        """One vector per representation."""
        return num_reps

    def release(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> Release:
        """Returns ``reps`` itself (``num_centroids`` and ``generator`` are unused)."""
        n = reps.shape[0]
        return Release(
            vectors=reps.detach().clone(),
            weights=torch.ones(n),
            guarantee=self.guarantee(num_reps=n, num_centroids=num_centroids),
            metrics={"num_released": float(n)},
        )

    def release_with_members(
        self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
    ) -> tuple[Release, torch.Tensor]:
        """Row ``i`` is released vector ``i``."""
        release = self.release(reps, num_centroids=num_centroids, generator=generator)
        return release, torch.arange(reps.shape[0])
