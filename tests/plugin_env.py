"""A fake installed distribution, so a plug-in reaches privfed through its entry point only.

``installed_env`` writes a ``*.dist-info`` folder (``METADATA`` and
``entry_points.txt``) into ``site`` and returns an environment whose
``PYTHONPATH`` holds ``site``, ``examples/`` and ``tests/plugins/``: a
subprocess (and Flower's Ray workers, which inherit it) then sees the
plug-in as installed, as far as ``importlib.metadata`` can tell.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where the plug-ins' modules are found.
PLUGIN_FOLDERS = (ROOT / "examples", ROOT / "tests" / "plugins")


def installed_env(site: Path, distribution: str, entry_point: str, group: str = "privfed.mechanisms") -> dict[str, str]:
    """An environment in which ``entry_point`` (``name = module:Object``) is in ``group`` of an installed distribution."""
    dist_info = site / f"{distribution.replace('-', '_')}-0.1.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(f"[{group}]\n{entry_point}\n")
    paths = (*map(str, PLUGIN_FOLDERS), str(site), os.environ.get("PYTHONPATH"))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


def run_privfed(env: dict[str, str], *args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """The real ``privfed`` CLI in a subprocess with ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "privfed.cli", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )
