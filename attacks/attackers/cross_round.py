"""Cross-round attack: unmix a client's releases over many rounds into estimates of its single representations.

One release of weighted summaries (``kanon`` centroids, noisy sums) hides
each image among the rows it was summed with. A client takes part in many
rounds, and its releases summarise overlapping sets of its images, grouped
differently: each round is one more set of equations on shared unknowns (a
memory of the last batches shares about ``memory_size / n`` of a larger
client's ``n`` images between rounds; a secret sample reads all of them).
The estimator treats the client's memory as ``n`` unknown unit vectors
(``n`` from the attacked round's weights, which count rows), and alternates

1. per round, an assignment of the unknowns to the released vectors with
   each vector's weight as its capacity (a linear assignment, as the
   equal-size clustering of ``kanon`` makes it), and
2. a few Adam steps on the unknowns so that each assigned group's sum points
   along its released vector (cosine), over every round of the window.

With one round this returns the released vectors themselves, each repeated
as often as its weight: what a single-round attack inverts. Two releases
whose groups differ by one image pin that image (the differencing argument
of ``tests/mechanisms/test_kanon_differencing.py``); many rounds pin more.
The model drifts between rounds and the client recomputes its memory from
fresh augmentations. The server knows every model it sent, so it first
maps each older round's vectors into the attacked round's representation
space: a least-squares linear map from one model's representations of
auxiliary views to the other's (a group's sum maps as its members do);
``decay`` still lets older rounds count less, and ``window`` bounds how far
back it reads. The estimates are inverted by a single-round attack (by
default ``decoder``) fitted to the attacked round's model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from attacks.attackers.aux_releases import views_through
from attacks.base import (
    AttackTarget,
    CrossRoundAttack,
    Estimates,
    Inversion,
    ProgressCallback,
    ReleaseHistory,
    check_settings,
)
from attacks.registry import get_attack_class, register_attack


def capacities(weights: torch.Tensor) -> torch.Tensor:
    """Rows each released vector stands for: its weight rounded, never below 0 (a DP weight may be)."""
    return weights.float().clamp_min(0).round().long()


def slot_vectors(weights: torch.Tensor) -> torch.Tensor:
    """The index of the released vector behind each row slot: vector ``j`` repeated ``capacities[j]`` times."""
    return torch.repeat_interleave(torch.arange(weights.shape[0]), capacities(weights))


def assign_rows(rows: torch.Tensor, vectors: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``[n]`` released vector per row (``-1``: no slot left), the most similar overall within capacities."""
    assignment = torch.full((rows.shape[0],), -1, dtype=torch.long)
    if slots.numel() == 0 or rows.shape[0] == 0:
        return assignment
    scores = (rows @ vectors[slots].T).double().numpy()
    row, slot = linear_sum_assignment(scores, maximize=True)
    assignment[torch.as_tensor(row)] = slots[torch.as_tensor(slot)]
    return assignment


def direction_loss(rows: torch.Tensor, vectors: torch.Tensor, assignment: torch.Tensor) -> torch.Tensor:
    """Sum over released vectors with rows of ``1 - cos(sum of its rows, vector)``."""
    kept = assignment >= 0
    sums = torch.zeros_like(vectors).index_add(0, assignment[kept], rows[kept])
    used = torch.bincount(assignment[kept], minlength=vectors.shape[0]) > 0
    return (1 - F.cosine_similarity(sums[used], vectors[used], dim=1)).sum()


def representation_map(
    source: AttackTarget, goal: AttackTarget, aux_images: torch.Tensor, *, generator: torch.Generator
) -> torch.Tensor:
    """``[D, D]`` least-squares map ``X`` with ``source reps @ X ≈ goal reps`` on the same auxiliary views (training
    mode batches of the clients' batch size, as clients compute representations)."""
    (before, after), _ = views_through([source, goal], aux_images, generator=generator)
    return torch.linalg.lstsq(before.double(), after.double()).solution.float()


def unmix(
    history: ReleaseHistory,
    *,
    iterations: int = 20,
    steps: int = 50,
    lr: float = 0.05,
    max_rows: int = 512,
    decay: float = 1.0,
    generator: torch.Generator,
) -> Estimates:
    """Estimates of the rows behind the last round's release (module docstring), and the vector each fed.

    Rows number the last round's total capacity, at most ``max_rows``; vectors of other rounds in the history
    cap theirs the same way, and a round with fewer slots than rows leaves some rows unassigned. A round ``d``
    rounds before the last counts ``decay ** d`` in the loss: the model drifts, so older rounds say less.
    """
    vectors = [v.detach().float().cpu() for v in history.vectors]
    slots = [slot_vectors(w.detach().cpu()) for w in history.weights]
    last = slots[-1]
    if last.numel() > max_rows:
        last = last[torch.randperm(last.numel(), generator=generator)[:max_rows]].sort().values
    dim = vectors[-1].shape[1]
    if last.numel() == 0:
        return Estimates(torch.zeros(0, dim), torch.zeros(0, dtype=torch.long))
    if len(vectors) == 1:
        return Estimates(vectors[-1][last], last)
    noise = 0.01 * torch.randn(last.numel(), dim, generator=generator)  # breaks the tie between a vector's rows
    free = (vectors[-1][last] + noise).requires_grad_(True)
    optimizer = torch.optim.Adam([free], lr=lr)
    round_weights = [decay ** (history.rounds[-1] - r) for r in history.rounds]
    for _ in range(iterations):
        with torch.no_grad():
            rows = F.normalize(free, dim=1)
            assignments = [assign_rows(rows, v, s) for v, s in zip(vectors, slots)]
        for _ in range(steps):
            rows = F.normalize(free, dim=1)
            loss = sum(
                w * direction_loss(rows, v, a) for w, v, a in zip(round_weights, vectors, assignments) if w > 0
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[union-attr]  # a sum of tensors is a tensor
            optimizer.step()
    with torch.no_grad():
        rows = F.normalize(free, dim=1)
        return Estimates(rows, assign_rows(rows, vectors[-1], slots[-1]))


@register_attack
class CrossRoundUnmixing(CrossRoundAttack):
    """Unmixes a client's releases across rounds, then inverts the estimates with a single-round attack."""

    name = "cross-round"
    description = (
        "reads every round's releases of a client up to the attacked one, estimates its single representations "
        "from how their groupings change, and inverts them with a single-round attack (decoder by default)"
    )

    def __init__(
        self,
        *,
        seed: int = 0,
        window: int = 40,
        iterations: int = 20,
        unmix_steps: int = 50,
        unmix_lr: float = 0.05,
        max_rows: int = 512,
        decay: float = 0.5,
        align: bool = True,
        align_images: int = 1024,
        inverter: str = "decoder",
        **inverter_settings: Any,
    ) -> None:
        super().__init__(seed=seed)
        check_settings(
            counts={
                "window": window, "iterations": iterations, "unmix_steps": unmix_steps, "max_rows": max_rows,
                "align_images": align_images,
            },
            rates={"unmix_lr": unmix_lr}, weights={"decay": decay},
        )
        if decay > 1:
            raise ValueError(f"decay must be at most 1 (an older round cannot count more), got {decay!r}")
        inverter_class = get_attack_class(inverter)
        if issubclass(inverter_class, CrossRoundAttack):
            raise ValueError(f"the inverter must be a single-round attack, not {inverter}")
        self.window, self.iterations, self.unmix_steps = int(window), int(iterations), int(unmix_steps)
        self.unmix_lr, self.max_rows, self.decay = float(unmix_lr), int(max_rows), float(decay)
        if not isinstance(align, bool):
            raise ValueError(f"align must be true or false, got {align!r}")
        self.align, self.align_images = align, int(align_images)
        # (older target, attacked target, map): targets kept so that their ids stay theirs.
        self._maps: dict[tuple[int, int], tuple[AttackTarget, AttackTarget, torch.Tensor]] = {}
        self.inverter = inverter_class(seed=seed, **inverter_settings)

    def settings(self) -> dict[str, Any]:
        return {
            **super().settings(), "window": self.window, "iterations": self.iterations, "unmix_steps": self.unmix_steps,
            "unmix_lr": self.unmix_lr, "max_rows": self.max_rows, "decay": self.decay, "align": self.align,
            "align_images": self.align_images,
            "inverter": {"method": self.inverter.name, **self.inverter.settings()},
        }

    def estimate(self, history: ReleaseHistory, aux_images: torch.Tensor) -> Estimates:
        if self.align and history.targets:
            history = self._aligned(history, aux_images)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + history.client)
        return unmix(
            history, iterations=self.iterations, steps=self.unmix_steps, lr=self.unmix_lr, max_rows=self.max_rows,
            decay=self.decay, generator=generator,
        )

    def _aligned(self, history: ReleaseHistory, aux_images: torch.Tensor) -> ReleaseHistory:
        """The history with every older round's vectors mapped into the attacked round's representation space."""
        goal = history.targets[-1]
        vectors = list(history.vectors)
        for i, source in enumerate(history.targets[:-1]):
            key = (id(source), id(goal))
            if key not in self._maps:
                generator = torch.Generator().manual_seed(self.seed * 7919 + source.round)
                images = aux_images[: self.align_images]
                self._maps[key] = (source, goal, representation_map(source, goal, images, generator=generator))
            vectors[i] = F.normalize(vectors[i].float() @ self._maps[key][2], dim=1)
        return ReleaseHistory(history.client, history.rounds, tuple(vectors), history.weights, history.targets)

    def fit(
        self, target: AttackTarget, aux_images: torch.Tensor, *, progress: ProgressCallback | None = None
    ) -> Inversion:
        return self.inverter.fit(target, aux_images, progress=progress)


