"""The attacker cannot reach ground truth: by what it imports and by what it reads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: Everything an attacker module may import: the attack interface, the mechanisms (run on auxiliary data),
#: the image transforms clients use, and general-purpose libraries. No dataset, run directory, replay or score.
ALLOWED = ("attacks.base", "attacks.registry", "attacks.attackers", "mechanisms", "privfed.data.augment", "privfed.errors")
LIBRARIES = ("__future__", "abc", "copy", "dataclasses", "math", "typing", "torch", "numpy")
#: Calls that read files or datasets: an attacker gets objects, never paths.
READERS = ("open", "load", "read_text", "read_bytes", "load_dataset", "cached_dataset", "read_round", "client_images")


def attacker_files() -> list[Path]:
    return sorted((REPO / "attacks" / "attackers").rglob("*.py")) + [REPO / "attacks" / "base.py", REPO / "attacks" / "registry.py"]


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def called_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def disallowed(modules: set[str]) -> set[str]:
    def ok(module: str) -> bool:
        return any(module == a or module.startswith(a + ".") for a in (*ALLOWED, *LIBRARIES))

    return {m for m in modules if not ok(m)}


@pytest.mark.parametrize("path", attacker_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_attacker_modules_import_nothing_that_holds_ground_truth(path):
    assert disallowed(imported_modules(path)) == set()


@pytest.mark.parametrize("path", attacker_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_attacker_modules_read_no_file_or_dataset(path):
    assert called_names(path) & set(READERS) == set()


def test_the_checks_catch_an_attacker_that_reaches_for_the_truth(tmp_path):
    """Not vacuous: each way of reaching ground truth is flagged."""
    cheat = tmp_path / "cheat.py"
    cheat.write_text(
        "import torch\nfrom attacks.scoring.ground_truth import replay_round\nfrom privfed.data import FederatedSplit\n"
        "from .. import evaluation\nimport privfed.recording\n"
        "def f(p):\n    return torch.load(p), open(p).read()\n"
    )
    assert disallowed(imported_modules(cheat)) == {
        "attacks.scoring.ground_truth", "privfed.data", "..", "privfed.recording"
    }
    assert {"load", "open"} <= called_names(cheat)


def test_the_scoring_side_is_imported_only_by_the_evaluation():
    users = {
        str(p.relative_to(REPO))
        for p in (REPO / "attacks").rglob("*.py")
        if "scoring" not in p.parts and any(m.startswith("attacks.scoring") for m in imported_modules(p))
    }
    assert users == {"attacks/evaluation.py"}
