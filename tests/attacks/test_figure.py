"""``attack.png``: one row per picked vector, drawn without touching the caller's matplotlib backend."""

from __future__ import annotations

import matplotlib
import numpy as np
import torch
from matplotlib.image import imread

from attacks.figure import COLUMNS, save_attack_figure


def test_the_attack_picture_has_a_row_per_pick_and_leaves_the_backend_alone(tmp_path):
    generator = torch.Generator().manual_seed(0)
    rows = [tuple(torch.rand(3, 16, 16, generator=generator) for _ in COLUMNS) for _ in range(5)]
    before = matplotlib.get_backend()
    matplotlib.use("svg")  # a backend other than Agg, as a notebook's inline one is
    try:
        save_attack_figure(tmp_path / "attack.png", rows, title="decoder on kanon, round 1", seed=0, max_rows=3)
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    image = imread(tmp_path / "attack.png")
    assert image.shape[:2] == (int(1.6 * 3 * 120), int(1.6 * len(COLUMNS) * 120))
    assert np.std(image[..., :3]) > 0.05
