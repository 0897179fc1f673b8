"""Every preset and study privfed ships passes privfed's own validation (a user's first run must not be refused)."""

from __future__ import annotations

from pathlib import Path

import pytest

from privfed.config import build_config, shipped_presets
from privfed.studies.grid import Study

PRESETS = list(shipped_presets().values())  # privfed/presets (configs/ in a checkout)
STUDIES = list(shipped_presets("study").values())


def test_presets_are_found() -> None:
    """Guards the two tests below against passing on an empty list."""
    assert len(PRESETS) >= 5 and len(STUDIES) >= 5


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_preset_validates(preset: Path) -> None:
    build_config(preset)  # raises PrivfedError naming the problem


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_study_validates_every_cell(study: Path) -> None:
    """Each cell's configuration (preset, base, grid values, seed) is built and validated, as ``privfed study`` does."""
    assert Study.load(study).cells()
