"""The attacker cannot reach ground truth: by what it imports and by what it reads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: Everything an attacker module may import: the attack interface, the mechanisms (run on auxiliary data),
#: the image transforms clients use, and general-purpose libraries. No dataset, run directory, replay or score.
ALLOWED = ("attacks.base", "attacks.registry", "attacks.attackers", "mechanisms", "privfed.data.augment", "privfed.errors")
LIBRARIES = ("__future__", "abc", "collections.abc", "copy", "dataclasses", "math", "typing", "torch", "numpy", "scipy.optimize")
#: Calls that read files or datasets: an attacker gets objects, never paths.
READERS = (
    "load", "read_text", "read_bytes", "fromfile", "load_dataset", "cached_dataset", "read_round", "client_images",
    "import_module",
)
#: Built-ins that open files or reach modules and attributes by name.
BUILTINS = ("open", "__import__", "getattr", "globals", "vars", "exec", "eval")
#: Names that reach modules at run time.
MODULE_HANDLES = ("sys", "importlib", "builtins")


def attacker_files() -> list[Path]:
    return [*sorted((REPO / "attacks" / "attackers").rglob("*.py")), REPO / "attacks" / "base.py", REPO / "attacks" / "registry.py"]


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def called_names(path: Path) -> set[str]:
    """Names called, as ``f(...)`` or ``x.f(...)``."""
    calls = [node.func for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]
    return {f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "") for f in calls}


def called_builtins(path: Path) -> set[str]:
    """Names called bare, ``f(...)``: built-ins (a method ``module.eval()`` is not ``eval``)."""
    calls = [node.func for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]
    return {f.id for f in calls if isinstance(f, ast.Name)}


def attribute_paths(path: Path) -> set[str]:
    """Dotted paths read through a module imported whole (``import privfed.data.augment`` binds ``privfed``)."""
    tree = ast.parse(path.read_text())
    roots = {  # the name an import binds -> the module it names
        alias.asname or alias.name.split(".")[0]: alias.name if alias.asname else alias.name.split(".")[0]
        for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, inner = [], node
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in roots:
                found.add(".".join([roots[inner.id], *reversed(parts)]))
    return found


def names_used(path: Path) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Name)}


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
    assert called_builtins(path) & set(BUILTINS) == set()
    assert names_used(path) & set(MODULE_HANDLES) == set()


@pytest.mark.parametrize("path", attacker_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_attribute_paths_through_imported_packages_stay_in_the_allowed_modules(path):
    """``import privfed.data.augment`` also binds ``privfed``: reading ``privfed.data.federated`` through it is refused."""
    outside = {p for p in attribute_paths(path) if disallowed({p}) and disallowed({p.rsplit(".", 1)[0]})}
    assert outside == set()


def test_importing_every_attacker_loads_no_scoring_recording_or_run_module():
    code = "import sys, attacks.attackers, attacks.base, attacks.registry; print('\\n'.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout.split())
    truth = ("attacks.scoring", "attacks.evaluation", "privfed.run.recording", "privfed.run.directory")
    assert not {m for m in loaded if m.startswith(truth)}


def test_the_checks_catch_an_attacker_that_reaches_for_the_truth(tmp_path):
    """Not vacuous: each way of reaching ground truth is flagged."""
    cheat = tmp_path / "cheat.py"
    cheat.write_text(
        "import torch\nfrom attacks.scoring.ground_truth import replay_round\nfrom privfed.data import FederatedSplit\n"
        "from .. import evaluation\nimport privfed.run.recording\nimport privfed.data.augment\nimport sys\n"
        "def f(p):\n    return torch.load(p), open(p).read(), __import__('attacks.scoring'), sys.modules\n"
        "def g(c):\n    return privfed.data.federated.FederatedSplit.of(c), privfed.data.augment.to_float\n"
    )
    assert disallowed(imported_modules(cheat)) == {
        "attacks.scoring.ground_truth", "privfed.data", "..", "privfed.run.recording", "sys"
    }
    assert "load" in called_names(cheat) and {"open", "__import__"} <= called_builtins(cheat)
    assert "sys" in names_used(cheat)
    outside = {p for p in attribute_paths(cheat) if disallowed({p}) and disallowed({p.rsplit(".", 1)[0]})}
    assert "privfed.data.federated.FederatedSplit.of" in outside and not any("augment" in p for p in outside)


def test_the_scoring_side_is_imported_only_by_the_evaluation():
    users = {
        str(p.relative_to(REPO))
        for p in (REPO / "attacks").rglob("*.py")
        if "scoring" not in p.parts and any(m.startswith("attacks.scoring") for m in imported_modules(p))
    }
    assert users == {"attacks/evaluation.py"}
