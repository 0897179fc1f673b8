"""The README is the newcomer's page: short, its commands real, its Python quickstart the tested example."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from privfed.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _bash_lines() -> list[list[str]]:
    """Every ``privfed ...`` command in the README's bash blocks, split into words (comments dropped)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            for part in line.split("&&"):
                words = shlex.split(part)
                if words[:1] == ["privfed"]:
                    commands.append(words[1:])
    return commands


def test_the_readme_stays_short() -> None:
    assert len(README.splitlines()) <= 150


def test_the_first_lines_are_the_install_and_test_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, flags=re.S).group(1).splitlines()
    assert first_block[0].startswith("pip install -e . && privfed train")
    assert first_block[1].startswith("pip install -e '.[test]' && python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[test]'" in ci and "python -m pytest" in ci


@pytest.mark.parametrize("words", _bash_lines(), ids=" ".join)
def test_every_flag_a_readme_command_uses_exists(words: list[str]) -> None:
    command = words[0]
    help_text = CliRunner().invoke(app, [command, "--help"], terminal_width=200).output
    for flag in (w.split("=", 1)[0] for w in words[1:] if w.startswith("--")):
        assert flag in help_text, f"privfed {command} has no {flag}"


def test_the_citation_file_carries_the_packages_version() -> None:
    from importlib.metadata import version

    citation = (ROOT / "CITATION.cff").read_text()
    assert re.search(rf"^version: {re.escape(version('privfed'))}$", citation, flags=re.M)


def test_every_document_the_readme_links_exists() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
