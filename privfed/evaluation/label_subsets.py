"""The labelled subsets of semi-supervised evaluation (paper: fine-tuning on 1 % and 10 % of the labels)."""

from __future__ import annotations

import numpy as np


def class_balanced_subset(labels: np.ndarray, fraction: float, *, seed: int) -> np.ndarray:
    """Sorted indices of ``fraction`` of every class (at least one each), drawn with ``seed``: a 1 % subset
    missing a class by chance would make accuracy depend on the draw more than on the encoder."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"the labelled fraction must be in (0, 1], got {fraction}")
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    chosen = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        count = max(1, round(fraction * members.size))
        chosen.append(rng.choice(members, size=count, replace=False))
    return np.sort(np.concatenate(chosen))
