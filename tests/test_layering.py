"""The layers depend one way: mechanisms <- privfed's core <- the Flower runtime, and attacks on top.

Runtime checks import a package in a fresh interpreter and look at what
got loaded. Static checks read every import in every module, lazy ones
inside functions and ``TYPE_CHECKING`` ones included (a loop through a lazy
import is still a loop in the design), and look for loops between modules
and between layers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("privfed", "mechanisms", "attacks")

#: privfed.secagg's Flower-free core, which privfed.privacy and the run's plan import.
SECAGG_CORE = tuple(f"privfed.secagg.{m}" for m in ("masks", "mask_pool", "quantization", "encoding", "settings", "identity"))
#: privfed.secagg's modules that run the protocol over Flower: a layer above the core, used by privfed.federation.
SECAGG_ON_FLOWER = tuple(
    f"privfed.secagg.{m}"
    for m in ("masking", "client_encoding", "client_agreement", "client_trust", "client_mod", "workflow")
)


def loaded_after(statement: str) -> set[str]:
    """Top-level names of the modules a fresh interpreter has loaded after ``statement``."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    return set(out.split())


def submodules(package: str) -> list[str]:
    root = REPO / package
    return sorted(
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for path in root.rglob("*.py")
    )


def test_mechanisms_loads_no_privfed_module():
    modules = loaded_after("\n".join(f"import {m}" for m in submodules("mechanisms")))
    assert not {m for m in modules if m.split(".")[0] in ("privfed", "attacks")}


@pytest.mark.parametrize("package", ["privfed.orchestra", "privfed.privacy", "privfed.data", "privfed.models"])
def test_the_core_loads_no_flower(package):
    modules = loaded_after("\n".join(f"import {m}" for m in submodules(package.replace(".", "/"))))
    assert not {m for m in modules if m.split(".")[0] in ("flwr", "ray")}


def test_the_secagg_core_loads_no_flower():
    modules = loaded_after("\n".join(f"import {m}" for m in ("privfed.secagg", *SECAGG_CORE)))
    assert not {m for m in modules if m.split(".")[0] in ("flwr", "ray")}


def test_every_secagg_module_is_in_the_core_or_on_flower():
    """A new module of privfed/secagg/ must be placed on one side (the core is checked to stay Flower-free)."""
    assert set(submodules("privfed/secagg")) == {"privfed.secagg", *SECAGG_CORE, *SECAGG_ON_FLOWER}


def test_the_server_side_driver_and_its_plan_do_not_know_the_runtime():
    modules = loaded_after("import privfed.run.driver, privfed.run.plan")
    assert not {m for m in modules if m.split(".")[0] in ("flwr", "ray")}


def imports_of(path: Path) -> set[str]:
    """Every module a file imports anywhere: at load time, inside functions (lazy) or for annotations."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def module_files(root: Path = REPO) -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a package's ``__init__`` re-exporting its own modules aside)."""
    files = module_files(root)
    return {
        name: {i for i in imports_of(path) if i in files and i != name and not name.startswith(i + ".")}
        for name, path in files.items()
    }


def layer(module: str) -> str:
    """``mechanisms``, ``attacks``, a subpackage of privfed (``privfed.federation``) or a top-level privfed module.

    privfed.secagg is two layers: its core, and its modules on Flower (``privfed.secagg[flower]``).
    """
    if module in SECAGG_ON_FLOWER:
        return "privfed.secagg[flower]"
    parts = module.split(".")
    if parts[0] != "privfed" or len(parts) == 1:
        return parts[0]
    return ".".join(parts[:2])


def loops(graph: dict[str, set[str]]) -> list[str]:
    """Nodes that can reach themselves."""

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        stack = list(graph.get(start, ()))
        while stack:
            node = stack.pop()
            if node not in seen:
                seen.add(node)
                stack.extend(graph.get(node, ()))
        return seen

    return sorted(node for node in graph if node in reach(node))


def layer_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    layers: dict[str, set[str]] = {}
    for module, deps in graph.items():
        layers.setdefault(layer(module), set()).update(layer(d) for d in deps if layer(d) != layer(module))
    return layers


def test_privfed_and_mechanisms_never_import_attacks():
    """Only the front doors on top of every layer, the command line and the Python API, reach the attacks."""
    graph = import_graph()
    users = {m for m, d in graph.items() if layer(m) != "attacks" and any(layer(x) == "attacks" for x in d)}
    assert users <= {"privfed.cli", "privfed.cli_help", "privfed.api"}


def test_mechanisms_never_import_privfed():
    graph = import_graph()
    assert not {m: d for m, d in graph.items() if layer(m) == "mechanisms" and any(x.startswith("privfed") for x in d)}


def test_no_import_loops_between_modules():
    assert loops(import_graph()) == []


def test_no_import_loops_between_layers():
    """E.g. the driver imports the strategy while the server app imports the driver: a loop between layers."""
    assert loops(layer_graph(import_graph())) == []


def test_the_loop_checks_see_loops(tmp_path):
    """Not vacuous: a lazy import back, or a loop through two packages, is found."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "privfed" / "a.py").write_text("import privfed.b\n")
    (tmp_path / "privfed" / "b.py").write_text("def f():\n    from privfed.a import g\n")
    assert loops(import_graph(tmp_path)) == ["privfed.a", "privfed.b"]
    (tmp_path / "privfed" / "b.py").write_text("from privfed.pkg.c import x\n")
    (tmp_path / "privfed" / "pkg").mkdir()
    (tmp_path / "privfed" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "privfed" / "pkg" / "c.py").write_text("if TYPE_CHECKING:\n    from privfed.a import Y\n")
    assert loops(layer_graph(import_graph(tmp_path))) == ["privfed.a", "privfed.b", "privfed.pkg"]


def scripts() -> list[Path]:
    """The scripts on top of the packages: benchmarks and examples."""
    return sorted(p for folder in ("benchmarks", "examples") for p in (REPO / folder).rglob("*.py"))


def project_imports(path: Path) -> list[tuple[str, str | None]]:
    """``(module, name)`` for every project import of a file (``name`` None for ``import module``)."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] in PACKAGES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in PACKAGES:
            found += [(str(node.module), a.name) for a in node.names]
    return found


def missing_names(path: Path) -> list[str]:
    """The project modules and names ``path`` imports that do not exist."""
    files = module_files()
    missing = []
    for module, name in project_imports(path):
        if module not in files:
            missing.append(module)
        elif name is not None and f"{module}.{name}" not in files:
            defined = {n for node in ast.parse(files[module].read_text()).body for n in _defined_names(node)}
            if name not in defined:
                missing.append(f"{module}.{name}")
    return missing


@pytest.mark.parametrize("path", scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_project_name_a_script_imports_exists(path):
    """A benchmark or example that imports a moved or removed name fails here, not when someone runs it."""
    assert missing_names(path) == []


def _defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, (ast.If, ast.Try)):
        return {n for child in node.body for n in _defined_names(child)}
    return set()


def test_the_script_check_sees_a_missing_name(tmp_path):
    """Not vacuous: a script importing a name its module lacks, or a module that is gone, is caught."""
    script = tmp_path / "bench.py"
    script.write_text("from privfed.config import TrainConfig, NoSuchThing\nimport privfed.no_such_module\n")
    assert missing_names(script) == ["privfed.config.NoSuchThing", "privfed.no_such_module"]


def test_no_script_imports_from_tests():
    """Benchmarks and examples run without the test suite; what they share with it lives in ``benchmarks/``."""
    assert {str(p.relative_to(REPO)): imports_from_tests(p) for p in scripts() if imports_from_tests(p)} == {}


def imports_from_tests(path: Path) -> list[str]:
    """The modules of the test suite a file imports, lazily or not."""
    return sorted(m for m in imports_of(path) if m.split(".")[0] == "tests")


def test_the_script_check_sees_an_import_from_tests(tmp_path):
    """Not vacuous: a lazy import from the test suite inside a function is caught."""
    script = tmp_path / "bench.py"
    script.write_text("import sys\n\ndef main():\n    from tests.secagg.harness import run_round\n")
    assert imports_from_tests(script) == ["tests.secagg.harness", "tests.secagg.harness.run_round"]
