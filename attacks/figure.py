"""``attack.png``: rows of private image, reconstruction, best-matching member and null, for a person to look at."""

from __future__ import annotations

from pathlib import Path

import torch

COLUMNS = ("private\n(source / members' mean)", "reconstruction", "best-matching\nmember", "null")


def save_attack_figure(path: Path, rows: list[tuple[torch.Tensor, ...]], *, title: str, seed: int, max_rows: int = 8) -> None:
    """Draws ``max_rows`` rows picked at random (not the best ones) from ``rows``."""
    from privfed.extras import require

    require("matplotlib", feature="attack.png")

    # A Figure, not pyplot: drawing leaves the caller's backend (a notebook's) alone.
    from matplotlib.figure import Figure

    if not rows:
        return
    pick = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))[:max_rows].tolist()
    fig = Figure(figsize=(1.6 * len(COLUMNS), 1.6 * len(pick)))
    axes = fig.subplots(len(pick), len(COLUMNS), squeeze=False)
    for r, index in enumerate(pick):
        for c, image in enumerate(rows[index]):
            ax = axes[r][c]
            ax.imshow(image.clamp(0, 1).permute(1, 2, 0).numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(COLUMNS[c], fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
