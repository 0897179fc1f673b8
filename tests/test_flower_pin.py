"""The Flower versions pyproject.toml admits: the one installed, both tested ends, and CI's check for the newest.

``.ci/flower_is_newest.py`` is loaded from its file (it is a script, not a
package module); only its query of the package index is replaced, by a list.
"""

from __future__ import annotations

import importlib.util
import tomllib
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]


def ci_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flower_is_newest", REPO / ".ci" / "flower_is_newest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def admitted(extra: str | None = None) -> SpecifierSet:
    """The flwr versions ``[project] dependencies`` admits (with ``extra``: that optional dependency's)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return next(r.specifier for r in map(Requirement, listed) if r.name == "flwr")


def test_the_installed_flower_is_one_pyproject_admits() -> None:
    """The suite runs on flwr 1.42 here; a pin that excludes it (it was <1.42) tests a version no install gets."""
    specifier = admitted()
    assert Version(version("flwr")) in specifier, (version("flwr"), str(specifier))


@pytest.mark.parametrize("extra", [None, "ray"])
def test_both_tested_ends_are_admitted_and_the_untested_next_minor_is_not(extra: str | None) -> None:
    """1.41 and 1.42 are the ends the suite ran on (docs/dev/flower-1.42-changes.md); 1.43 is admitted only after."""
    specifier = admitted(extra)
    assert all(Version(v) in specifier for v in ("1.41.0", "1.42.0", "1.42.9")), str(specifier)
    assert not any(Version(v) in specifier for v in ("1.40.9", "1.43.0")), str(specifier)
    assert ci_check().allowed_flwr().specifier == admitted()  # CI's check reads the same requirement


@pytest.mark.parametrize(("released", "code"), [
    (lambda installed: [installed], 0),
    (lambda installed: [installed, Version("1.42.99")], 1),  # a newer allowed release: CI ran on an older one
    (lambda installed: [installed, Version("1.43.0"), Version("2.0.0")], 0),  # newer, but not allowed
])
def test_ci_fails_unless_the_installed_flower_is_the_newest_allowed(
    released: Callable[[Version], list[Version]], code: int, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    check = ci_check()
    installed = Version(version("flwr"))
    monkeypatch.setattr(check, "released_flwr", lambda: released(installed))
    assert check.main() == code
    assert f"ci: flwr {installed} installed" in capsys.readouterr().out


def test_ci_runs_the_check_before_the_suite() -> None:
    """A check CI never runs would not stop a suite that ran on an older Flower."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert lines.index("python .ci/flower_is_newest.py") < lines.index("python -m pytest")
