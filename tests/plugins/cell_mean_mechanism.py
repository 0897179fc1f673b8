"""A small third-party secure-sum mechanism, installed only through the ``privfed.mechanisms`` entry point.

Each client's share is its exact per-cell table (the cells are the public
global centroids): every representation, clipped to norm 1, is rounded to
a fixed-point grid and added to its nearest centroid's sum. The server reads
only the SecAgg+ sum of the shares and moves each centroid to its cell's
normalised summed mean. No noise: it guarantees nothing beyond what the
secure sum hides. It imports ``mechanisms`` and never ``privfed``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mechanisms.base import Guarantee, SecureSumMechanism

#: Fixed-point units per unit of a coordinate.
SCALE = 2**10


class CellMeanMechanism(SecureSumMechanism):
    name = "cellmean"
    description = "exact per-cell sums of the representations, summed under SecAgg+ (test plugin, no privacy)"

    def __init__(self, *, min_shares: int, modulus: int) -> None:
        self.min_shares = min_shares
        self.modulus = modulus
        self.centres: torch.Tensor | None = None

    def observe_global_centroids(self, centroids: torch.Tensor) -> None:
        self.centres = centroids.detach().float().cpu()

    def guarantee(self, *, num_reps: int, num_centroids: int) -> Guarantee:
        return Guarantee(kind="none", statement="no protection beyond the secure sum")

    def share_length(self, *, num_cells: int, dim: int) -> int:
        return num_cells * (dim + 1)

    def check_secure_sum(self, *, threshold: int, modulus: int) -> None:
        if threshold < self.min_shares or modulus != self.modulus:
            raise ValueError(f"cellmean sums at least {self.min_shares} shares mod {self.modulus}")

    def share(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> np.ndarray:
        assert self.centres is not None, "the server sends the global centroids every training round"
        x = reps.detach().float().cpu()
        x = x / x.norm(dim=1, keepdim=True).clamp(min=1.0)
        cells = (x @ self.centres.T).argmax(dim=1)
        table = torch.zeros(self.centres.shape[0], x.shape[1] + 1, dtype=torch.int64)
        table[:, :-1].index_add_(0, cells, torch.round(x * SCALE).long())
        table[:, -1].index_add_(0, cells, torch.full_like(cells, SCALE))
        return np.mod(table.flatten().numpy(), self.modulus)

    def combine(self, total: np.ndarray, *, centroids: torch.Tensor, num_summed: int) -> torch.Tensor:
        half = self.modulus // 2
        table = torch.from_numpy((np.mod(total + half, self.modulus) - half).reshape(centroids.shape[0], -1))
        sums, counts = table[:, :-1].double(), table[:, -1]
        moved = counts > 0
        updated = centroids.detach().double().clone()
        updated[moved] = F.normalize(sums[moved], dim=1)
        return updated.to(centroids.dtype)
