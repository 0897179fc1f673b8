"""Fixtures of the resume tests that damage a real stopped run (test_resume_integrity and its review)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.run.test_resume_integrity import stopped_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ldp run stopped after round 1 (``runs / "stopped"``), once per test file."""
    folder = tmp_path_factory.mktemp("stopped-runs")
    stopped_run(folder / "stopped")
    return folder


@pytest.fixture
def run(runs: Path, tmp_path: Path) -> Path:
    """A copy of the stopped run, to damage."""
    shutil.copytree(runs / "stopped", tmp_path / "run")
    return tmp_path / "run"


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test at once if the resume reaches the runtime (it must be refused before)."""
    import privfed.federation.simulation as simulation

    monkeypatch.setattr(simulation, "simulate", lambda *a, **k: pytest.fail("the run was not refused"))
