"""Fails CI unless the installed flwr is the newest release pyproject.toml allows.

CI installs fresh, so the resolver should pick that release; if it does not (a
cached wheel, another package's cap), the suite did not test what a new user gets.
Asks only the package index pip is configured with (`pip index versions`).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version


def allowed_flwr() -> Requirement:
    """The ``flwr`` requirement in ``[project] dependencies``."""
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    return next(r for r in map(Requirement, project["dependencies"]) if r.name == "flwr")


def released_flwr() -> list[Version]:
    """Every flwr release the configured index lists."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "flwr"], capture_output=True, text=True, check=True
    ).stdout
    listed = re.search(r"Available versions: (.+)", out)
    if listed is None:
        raise SystemExit(f"ci: cannot read flwr's releases from `pip index versions flwr`:\n{out}")
    return [Version(v.strip()) for v in listed.group(1).split(",")]


def main() -> int:
    requirement, installed = allowed_flwr(), Version(version("flwr"))
    newest = max(requirement.specifier.filter(released_flwr()))
    print(f"ci: flwr {installed} installed; newest allowed by {requirement.specifier} is {newest}")
    if installed != newest:
        print(f"ci: the suite must run on flwr {newest}, not {installed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
