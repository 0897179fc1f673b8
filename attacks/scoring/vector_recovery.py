"""How close a cross-round attack's estimates come to the client's actual memory rows, before any inversion.

A vector-space figure that resolves at CPU scale, where image scores of every mechanism sit within a few dB of
each other: the mean cosine of a one-to-one matching of estimates to rows (each row recovered at most once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment


def matched_cosine(estimates: torch.Tensor, rows: torch.Tensor) -> float:
    """Mean cosine over the best one-to-one matching of ``[m, D]`` estimates to ``[n, D]`` rows (min(m, n) pairs)."""
    if estimates.shape[0] == 0 or rows.shape[0] == 0:
        raise ValueError("matching needs at least one estimate and one row")
    cosines = F.normalize(estimates.float(), dim=1) @ F.normalize(rows.float(), dim=1).T
    picked = linear_sum_assignment(cosines.double().numpy(), maximize=True)
    return float(cosines[torch.as_tensor(picked[0]), torch.as_tensor(picked[1])].mean())
