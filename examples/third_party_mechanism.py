"""A third-party DP mechanism: Gaussian noisy cell sums over a public random partition.

Copy this file into your own package and declare the class in the
``privfed.mechanisms`` entry-point group of its ``pyproject.toml``::

    [project.entry-points."privfed.mechanisms"]
    gauss-cells = "mypkg.third_party_mechanism:GaussianCellSums"

Once installed, ``privfed train --mechanism gauss-cells --epsilon 3`` plans
the run's budget with :meth:`GaussianCellSums.calibrate`, charges every
release's :meth:`privacy_events` to the client's ledger and states the
guarantee, without privfed naming the mechanism anywhere
(``tests/test_third_party_mechanism.py``). It imports ``mechanisms``, the
public interface, and never ``privfed``.

A release clips every representation to L2 norm ``radius``, puts it in the
cell of its nearest public random direction (``num_centroids`` of them) and
adds ``N(0, (noise_multiplier * radius)^2)`` to every coordinate of each cell
sum and ``N(0, noise_multiplier^2)`` to each cell count; the rest is
post-processing. Replacing one representation by another moves the sums by
at most twice the radius and the counts by sqrt(2), so a release is two
Gaussian mechanisms, one ``"gaussian"`` event with ``count = 2``, which
privfed's replace-one accountant charges. DP noise comes from the operating
system's CSPRNG (:class:`random.SystemRandom`), never from ``generator``.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

import torch

from mechanisms.accounting import calibration_discretisation, epsilon_of
from mechanisms.base import DIFFERENTIAL_PRIVACY, Guarantee, PrivacyEvent, Release, ReleaseMechanism, replace_one_dp_guarantee

#: Gaussian mechanisms per release: the cell sums and the cell counts.
GAUSSIANS = 2


@lru_cache(maxsize=64)
def _epsilon(noise_multiplier: float, delta: float, compositions: int, discretisation: float) -> float:
    event = PrivacyEvent("gaussian", {"noise_multiplier": noise_multiplier, "count": float(compositions)})
    return epsilon_of([event], delta, discretisation=discretisation)


class GaussianCellSums(ReleaseMechanism):
    """(epsilon, delta)-DP noisy cell sums and counts over a public random partition."""

    name = "gauss-cells"
    description = "example plug-in: Gaussian noisy cell sums over a public partition; (epsilon, delta) per release"
    guarantee_kind = DIFFERENTIAL_PRIVACY

    def __init__(self, *, noise_multiplier: float, delta: float, radius: float = 1.0) -> None:
        if not (noise_multiplier > 0 and 0 < delta < 1 and radius > 0):
            raise ValueError(f"need noise_multiplier > 0, 0 < delta < 1, radius > 0; got {noise_multiplier}, {delta}, {radius}")
        self.noise_multiplier, self.delta, self.radius = float(noise_multiplier), float(delta), float(radius)

    @classmethod
    def calibrate(cls, *, epsilon: float, delta: float, num_releases: int) -> dict[str, Any]:
        """The smallest noise multiplier (to 1e-4 relative) whose ``num_releases`` releases fit (epsilon, delta).

        Bisection on the PLD grid privfed's ledger uses for these events,
        keeping the side whose epsilon is at most the target.
        """
        if not (epsilon > 0 and 0 < delta < 1 and num_releases >= 1):
            raise ValueError(f"need epsilon > 0, 0 < delta < 1, num_releases >= 1; got {epsilon}, {delta}, {num_releases}")
        compositions = GAUSSIANS * num_releases
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
        return (PrivacyEvent("gaussian", {"noise_multiplier": self.noise_multiplier, "count": float(GAUSSIANS)}),)

    @property
    def epsilon(self) -> float:
        """Per-release epsilon at ``delta`` (PLD, fine grid)."""
        return _epsilon(self.noise_multiplier, self.delta, GAUSSIANS, 1e-4)

    def guarantee(self, *, num_reps: int, num_centroids: int) -> Guarantee:
        return replace_one_dp_guarantee(
            self.epsilon, self.delta, accounting="Gaussian cell sums and counts, PLD", covers="the released cells"
        )

    def release(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> Release:
        if reps.ndim != 2 or num_centroids < 1:
            raise ValueError(f"need reps [n, D] and num_centroids >= 1; got {tuple(reps.shape)}, {num_centroids}")
        n, dim = reps.shape
        x = reps.detach().double().cpu()
        x = x * torch.clamp(self.radius / x.norm(dim=1, keepdim=True).clamp_min(1e-30), max=1.0)
        directions = torch.nn.functional.normalize(torch.randn(num_centroids, dim, generator=generator, dtype=torch.float64))
        cell = (x @ directions.T).argmax(dim=1) if n else torch.zeros(0, dtype=torch.long)
        sums = torch.zeros(num_centroids, dim, dtype=torch.float64).index_add_(0, cell, x)
        counts = torch.bincount(cell, minlength=num_centroids).double()

        source = random.SystemRandom()

        def noise(count: int, sigma: float) -> torch.Tensor:
            return torch.tensor([source.gauss(0.0, sigma) for _ in range(count)], dtype=torch.float64)

        noisy_sums = sums + noise(num_centroids * dim, self.noise_multiplier * self.radius).reshape(num_centroids, dim)
        noisy_counts = counts + noise(num_centroids, self.noise_multiplier)

        # Post-processing of noisy values and public directions only.
        norms = noisy_sums.norm(dim=1, keepdim=True)
        vectors = torch.where(norms > 0, noisy_sums / norms.clamp_min(1e-300), directions)
        weights = noisy_counts.clamp_min(0.0)
        if not weights.sum() > 0:
            weights = torch.ones(num_centroids, dtype=torch.float64)
        return Release(
            vectors=vectors.to(reps.dtype if reps.is_floating_point() else torch.float32),
            weights=weights.float(),
            guarantee=self.guarantee(num_reps=n, num_centroids=num_centroids),
            events=self.privacy_events(),
            metrics={"epsilon": self.epsilon, "delta": self.delta, "noisy_num_reps": float(noisy_counts.sum())},
        )
