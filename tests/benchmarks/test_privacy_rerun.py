"""The README's results table is the re-run's, printed by ``benchmarks/privacy_rerun.py`` from its saved rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "docs" / "results" / "privacy-cpu-cifar10-rerun" / "rows.json"


@pytest.fixture(scope="module")
def rerun():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "benchmarks"))  # the script imports setting_comparison as a sibling
        yield load_script("privacy_rerun", ROOT / "benchmarks" / "privacy_rerun.py")


@pytest.fixture(scope="module")
def rows() -> dict:
    return json.loads(ROWS.read_text())


def test_every_setting_ran_on_three_seeds_with_every_column(rerun, rows):
    assert set(rows) == set(rerun.SETTINGS)
    for name, runs in rows.items():
        assert [r["seed"] for r in runs] == [0, 1, 2], name
        assert all(None not in (r["knn"], r["linear"], r["cosine_last5"]) for r in runs), name


def test_the_readme_table_is_the_scripts_output_from_the_saved_rows(rerun, rows):
    table = rerun.table(rows)
    readme = (ROOT / "README.md").read_text()
    assert table in readme
    assert table in (ROWS.parent / "README.md").read_text()


def test_every_setting_that_releases_was_attacked_at_its_last_round_on_every_seed(rerun, rows):
    """The attack columns: ``cross-round`` (which also scores the round alone) where releases are in the clear,
    the secure-sum ``decoder`` for ``ddp-sums`` (no per-client history to read), nothing without releases."""
    assert rerun.attack_method("ddp1") == "decoder" and rerun.attack_method("fixed") is None
    for name, runs in rows.items():
        method = rerun.attack_method(name)
        single = [r["attack_single_psnr"] for r in runs]
        cross = [r["attack_cross_psnr"] for r in runs]
        assert (None not in single) if method else single == [None] * 3, name
        assert (None not in cross) if method == "cross-round" else cross == [None] * 3, name
