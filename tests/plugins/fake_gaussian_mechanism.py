"""A small third-party DP mechanism, installed only through the ``privfed.mechanisms`` entry point.

It is not registered at import: ``tests/test_third_party_mechanism.py``
builds a fake installed distribution whose ``entry_points.txt`` names
:class:`FakeGaussianMechanism`, and privfed must find it from there alone.
It imports ``mechanisms`` (the public mechanism interface and its
accountant helpers) and never ``privfed``.

The mechanism (Gaussian noisy cell sums over a public partition):

1. clip every representation to L2 norm 1 (``radius``);
2. draw ``L`` public unit directions from ``generator`` (data-independent)
   and put each representation in the cell of its nearest direction;
3. release, for every cell, its sum plus ``N(0, sigma^2 I_D)`` and its count
   plus ``N(0, sigma^2)``, with ``sigma = noise_multiplier * 1``;
4. post-processing only: each vector is its cell's noisy sum normalised
   (the public direction if that sum is exactly zero), each weight its noisy
   count clamped at 0 (all ones if every clamped count is 0).

Privacy unit: one representation, replaced by another (privfed's replace-one
neighbours). Cells are disjoint, so one representation contributes a vector
of norm at most 1 to one cell sum and 1 to one cell count; replacing it moves
the concatenated ``L * D`` sums by at most 2 in L2 and the ``L`` counts by at
most sqrt(2). One release is therefore two Gaussian mechanisms of noise
multiplier ``noise_multiplier`` (per unit contribution), recorded as one
``"gaussian"`` privacy event with ``count = 2``, which privfed's accountant
charges at the replacement shift of 2.

DP noise comes from the operating system's CSPRNG (:class:`random.SystemRandom`).
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

import torch

from mechanisms.accounting import calibration_discretisation, epsilon_of
from mechanisms.base import DIFFERENTIAL_PRIVACY, Guarantee, Mechanism, PrivacyEvent, Release

#: Gaussian mechanisms per release: the cell sums and the cell counts.
GAUSSIANS_PER_RELEASE = 2


@lru_cache(maxsize=64)
def _epsilon(noise_multiplier: float, delta: float, compositions: int, discretisation: float) -> float:
    event = PrivacyEvent("gaussian", {"noise_multiplier": noise_multiplier, "count": float(compositions)})
    return epsilon_of([event], delta, discretisation=discretisation)


class FakeGaussianMechanism(Mechanism):
    """(epsilon, delta)-DP noisy cell sums over a public random partition (test plugin)."""

    name = "fakegauss"
    description = "test plugin: Gaussian noisy cell sums over a public partition; (epsilon, delta) per release"
    guarantee_kind = DIFFERENTIAL_PRIVACY

    def __init__(self, *, noise_multiplier: float, delta: float, radius: float = 1.0) -> None:
        if not noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if not radius > 0:
            raise ValueError(f"radius must be > 0, got {radius}")
        self.noise_multiplier = float(noise_multiplier)
        self.delta = float(delta)
        self.radius = float(radius)

    # -- privacy -------------------------------------------------------------

    @classmethod
    def calibrate(cls, *, epsilon: float, delta: float, num_releases: int) -> dict[str, Any]:
        """Smallest noise multiplier (to 1e-4 relative) whose ``num_releases`` releases fit (epsilon, delta).

        The composition is privfed's (replace-one: a replaced representation
        moves a cell sum by at most twice the radius) on the
        same grid privfed's ledger uses for these events
        (:func:`mechanisms.accounting.calibration_discretisation`), and the
        bisection keeps the side whose epsilon is at most the target.
        """
        if not epsilon > 0 or not 0 < delta < 1 or num_releases < 1:
            raise ValueError(f"need epsilon > 0, 0 < delta < 1, num_releases >= 1; got {epsilon}, {delta}, {num_releases}")
        compositions = GAUSSIANS_PER_RELEASE * num_releases
        grid = calibration_discretisation(epsilon, compositions)

        def fits(z: float) -> bool:
            return _epsilon(z, delta, compositions, grid) <= epsilon

        upper = 1.0
        while not fits(upper):
            upper *= 2.0
        lower = upper / 2.0
        while fits(lower):
            upper, lower = lower, lower / 2.0
        while upper - lower > 1e-4 * upper:
            middle = 0.5 * (lower + upper)
            lower, upper = (lower, middle) if fits(middle) else (middle, upper)
        return {"noise_multiplier": upper, "delta": float(delta)}

    def privacy_events(self) -> tuple[PrivacyEvent, ...]:
        """Two Gaussian mechanisms of L2 sensitivity 1 (cell sums, cell counts)."""
        return (PrivacyEvent("gaussian", {"noise_multiplier": self.noise_multiplier, "count": float(GAUSSIANS_PER_RELEASE)}),)

    @property
    def epsilon(self) -> float:
        """Per-release epsilon at ``delta`` (PLD, fine grid)."""
        return _epsilon(self.noise_multiplier, self.delta, GAUSSIANS_PER_RELEASE, 1e-4)

    def guarantee(self, *, num_reps: int, num_centroids: int) -> Guarantee:
        eps = self.epsilon
        return Guarantee(
            kind=DIFFERENTIAL_PRIVACY,
            epsilon=eps,
            delta=self.delta,
            statement=(
                f"This release is ({eps:.3g}, {self.delta:.3g})-differentially private with respect to adding or "
                "removing any one of the client's representations (Gaussian cell sums and counts, PLD accountant)."
            ),
        )

    # -- release -------------------------------------------------------------

    def release(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> Release:
        if reps.ndim != 2:
            raise ValueError(f"reps must be [n, D], got shape {tuple(reps.shape)}")
        if num_centroids < 1:
            raise ValueError(f"num_centroids must be >= 1, got {num_centroids}")
        n, dim = reps.shape
        x = reps.detach().double().cpu()
        x = x * torch.clamp(self.radius / x.norm(dim=1, keepdim=True).clamp_min(1e-30), max=1.0)
        directions = torch.randn(num_centroids, dim, generator=generator, dtype=torch.float64)
        directions = directions / directions.norm(dim=1, keepdim=True)
        cell = (x @ directions.T).argmax(dim=1) if n else torch.zeros(0, dtype=torch.long)
        sums = torch.zeros(num_centroids, dim, dtype=torch.float64).index_add_(0, cell, x)
        counts = torch.bincount(cell, minlength=num_centroids).double()

        sigma = self.noise_multiplier * self.radius  # L2 sensitivity of the sums is the radius ...
        count_sigma = self.noise_multiplier  # ... and of the counts 1
        source = random.SystemRandom()
        noisy_sums = sums + torch.tensor(
            [source.gauss(0.0, sigma) for _ in range(num_centroids * dim)], dtype=torch.float64
        ).reshape(num_centroids, dim)
        noisy_counts = counts + torch.tensor([source.gauss(0.0, count_sigma) for _ in range(num_centroids)], dtype=torch.float64)

        # Post-processing of noisy values and public directions only.
        norms = noisy_sums.norm(dim=1, keepdim=True)
        vectors = torch.where(norms > 0, noisy_sums / norms.clamp_min(1e-300), directions)
        weights = noisy_counts.clamp_min(0.0)
        if not weights.sum() > 0:
            weights = torch.ones(num_centroids, dtype=torch.float64)
        out_dtype = reps.dtype if reps.is_floating_point() else torch.float32
        return Release(
            vectors=vectors.to(out_dtype),
            weights=weights.float(),
            guarantee=self.guarantee(num_reps=n, num_centroids=num_centroids),
            events=self.privacy_events(),
            metrics={"epsilon": self.epsilon, "delta": self.delta, "noisy_num_reps": float(noisy_counts.sum())},
        )
