"""`privfed --help`: plain text without escapes, train's options in panels, registry choices (plug-ins too)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from privfed.config import OPTION_PANELS, TrainConfig
from tests.plugin_env import installed_env
from tests.test_third_party_mechanism import ENTRY as PLUGIN_ENTRY
from tests.test_third_party_mechanism import NAME as PLUGIN_MECHANISM

COMMANDS = ("train", "evaluate", "attack", "plot", "study", "tune", "attacks", "mechanisms", "datasets", "certs")


def _help(*args: str, env: dict[str, str] | None = None, columns: int = 80) -> str:
    env = dict(env or os.environ, COLUMNS=str(columns))
    result = subprocess.run(
        [sys.executable, "-m", "privfed.cli", *args, "--help"], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_no_backslash_escapes(command):
    text = _help(command)
    assert "\\" not in text, text


def test_every_train_field_is_in_exactly_one_panel():
    panelled = [name for names in OPTION_PANELS.values() for name in names]
    assert sorted(panelled) == sorted(f.name for f in dataclasses.fields(TrainConfig))


def _sections(text: str) -> dict[str, str]:
    """Each ``Title:`` section of a help text (unindented heading lines) and its body."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            current = sections.setdefault(line[:-1], [])
        elif current is not None:
            current.append(line)
    return {title: "\n".join(lines) for title, lines in sections.items()}


@pytest.mark.parametrize("columns", [80, 200])
def test_train_help_groups_options_by_panel_and_keeps_long_names_whole(columns):
    sections = _sections(_help("train", columns=columns))
    assert list(OPTION_PANELS) == [title for title in sections if title in OPTION_PANELS]
    for panel, names in OPTION_PANELS.items():
        for name in names:
            assert "--" + name.replace("_", "-") in sections[panel], (panel, name)
    assert max(len(line) for text in sections.values() for line in text.splitlines()) <= max(columns, 80)


def test_train_help_lists_registry_choices_and_which_mechanisms_need_epsilon():
    text = " ".join(_help("train").split())  # unwrapped
    assert "One of: ddp-sums, kanon, ldp, ldp-sums, reps." in text
    assert "One of: resnet8, resnet20, resnet18." in text
    assert "One of: auto, cpu, cuda." in text
    assert "One of: kmeans, official." in text
    assert "orchestra-fixed-centroids, simclr" in text
    assert "Needed (or --epsilon-per-release) by ddp-sums, ldp, ldp-sums." in text


@pytest.mark.parametrize("command", ["evaluate", "attack", "plot", "study", "tune"])
def test_arguments_have_their_help(command):
    section = _sections(_help(command))["Arguments"]
    assert len(section.replace("[required]", "").split()) >= 4, section  # the name and its help, not only [required]


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    return installed_env(tmp_path_factory.mktemp("site"), "fake-privfed-plugin", PLUGIN_ENTRY)


def test_a_plugin_mechanism_is_a_choice_and_a_dp_mechanism(plugin_env):
    text = " ".join(_help("train", env=plugin_env).split())
    assert f"kanon, ldp, ldp-sums, reps, {PLUGIN_MECHANISM}." not in text  # sorted by name, among the built-ins
    assert "One of: ddp-sums, gauss-cells, kanon, ldp, ldp-sums, reps." in text
    assert "by ddp-sums, gauss-cells, ldp, ldp-sums." in text


def test_a_bad_mechanism_is_refused_with_the_choices(plugin_env):
    result = subprocess.run(
        [sys.executable, "-m", "privfed.cli", "train", "--mechanism", "magic"],
        capture_output=True, text=True, timeout=120, env=plugin_env,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "unknown mechanism 'magic' (choose from ddp-sums, gauss-cells, kanon, ldp, ldp-sums, reps)" in result.stderr


def test_help_does_not_import_torch():
    """`privfed --help` stays fast: the registries that need torch are read only for a command's own help."""
    script = "import sys\nfrom privfed import cli\ncli.main(['--help'])\n"
    check = "import atexit, sys\natexit.register(lambda: print('torch' in sys.modules, file=sys.stderr))\n"
    result = subprocess.run([sys.executable, "-c", check + script], capture_output=True, text=True, timeout=120)
    assert result.stderr.strip().splitlines()[-1] == "False", result.stderr
