"""Optional dependencies stay optional: `privfed train` runs without them, and a feature that needs one names its extra."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from privfed.config import build_config
from privfed.errors import PrivfedError
from privfed.extras import EXTRAS, require

REPO = Path(__file__).resolve().parents[1]
OPTIONAL = ("opacus", "matplotlib")

#: Runs a tiny `privfed train` in an interpreter where the optional packages cannot be imported (as if not installed).
WITHOUT_EXTRAS = """
import json, sys
for name in {optional!r}:
    sys.modules[name] = None  # `import name` now fails, and find_spec says it is not there
from privfed.cli import main
try:
    main(["train", "--config", "quick", "--dataset", "shapes:120", "--num-clients", "2", "--rounds", "1",
          "--no-secagg", "--out", {out!r}])
except SystemExit as stop:
    assert not stop.code, stop.code
loaded = sorted(m for m, v in sys.modules.items() if v is not None and m.split(".")[0] in {optional!r})
print(json.dumps(loaded))
"""


def test_train_runs_without_the_optional_packages(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = WITHOUT_EXTRAS.format(optional=OPTIONAL, out=str(out))
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 1 and summary["stopped_early"] is None
    assert not (out / "curves.png").exists()
    assert "pip install 'privfed[plots]'" in done.stdout + done.stderr  # why there is no picture


@pytest.mark.parametrize("module", OPTIONAL)
def test_a_missing_package_names_its_extra(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    package, extra = EXTRAS[module]
    with pytest.raises(PrivfedError, match=rf"needs {package}: pip install 'privfed\[{extra}\]'"):
        require(module, feature="this")


def test_require_passes_for_an_installed_package() -> None:
    require("matplotlib", feature="plots")  # the test extra installs every extra


def test_dp_sgd_is_refused_before_round_0_without_opacus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from privfed.federation.simulation import simulate
    from privfed.run.plan import plan_run

    plan = plan_run(build_config("quick", dataset="shapes:120", num_clients=2, rounds=1, dp_sgd=True,
                                 out=str(tmp_path / "run")))
    monkeypatch.setitem(sys.modules, "opacus", None)
    with pytest.raises(PrivfedError, match=r"DP-SGD \(--dp-sgd\) needs opacus: pip install 'privfed\[dp-sgd\]'"):
        simulate(plan)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_plots_refuse_with_the_extra_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from privfed.run.curves import plot_curves

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PrivfedError, match=r"pip install 'privfed\[plots\]'"):
        plot_curves([], tmp_path / "curves.png")


def test_the_extras_match_pyproject() -> None:
    """Every extra the errors name exists, holds the package, and the test extra installs them all."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    core = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for package, extra in EXTRAS.values():
        assert any(req.startswith(package) for req in extras[extra]), (package, extra)
        assert not any(req.startswith(package) for req in core), package
        assert any(extra in req for req in extras["test"] if req.startswith("privfed[")), extra
