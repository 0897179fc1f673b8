"""The CLI's help: plain text in one section per panel, each registry's names as an option's choices."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import click
from typer.core import TyperCommand

from privfed.config import DEVICES, GLOBAL_CLUSTERINGS, RUNTIMES
from privfed.errors import PrivfedError

#: Help text is wrapped to the terminal, up to this width (click's own limit is 80).
HELP_MAX_WIDTH = 120


def _mechanism_names(*, dp_only: bool = False) -> list[str]:
    from mechanisms import MechanismRegistrationError, available_mechanisms, dp_mechanisms

    try:
        return dp_mechanisms() if dp_only else list(available_mechanisms())
    except MechanismRegistrationError as err:
        raise PrivfedError(str(err)) from None


def _backbone_names() -> list[str]:
    from privfed.models.resnet import BACKBONES

    return list(BACKBONES)


def _method_names() -> list[str]:
    from privfed.methods import available_methods

    return list(available_methods())


def attack_names() -> list[str]:
    from attacks import available_attacks

    return list(available_attacks())


class RegistryChoice(click.ParamType):
    """A name from a registry, read when first needed, so plug-ins appear and ``privfed`` starts without torch."""

    name = "choice"

    def __init__(self, noun: str, names: Callable[[], Sequence[str]]) -> None:
        self.noun = noun
        self._names = names

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self._names())

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "NAME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if value in self.choices:
            return str(value)
        self.fail(f"unknown {self.noun} {value!r} (choose from {', '.join(self.choices)})", param, ctx)


#: The enumerated :class:`TrainConfig` fields and where their names come from (plug-ins included).
CHOICES: dict[str, RegistryChoice] = {
    "method": RegistryChoice("method", _method_names),
    "backbone": RegistryChoice("backbone", _backbone_names),
    "global_clustering": RegistryChoice("global clustering", lambda: GLOBAL_CLUSTERINGS),
    "mechanism": RegistryChoice("mechanism", _mechanism_names),
    "device": RegistryChoice("device", lambda: DEVICES),
    "runtime": RegistryChoice("runtime", lambda: RUNTIMES),
}
#: Help sentences that need a registry, added when the help is shown.
LATE_HELP: dict[str, Callable[[], str]] = {
    "epsilon": lambda: f"Needed (or --epsilon-per-release) by {', '.join(_mechanism_names(dp_only=True)) or 'none installed'}.",
}


class HelpCommand(TyperCommand):
    """Plain help in one section per ``rich_help_panel``, with each registry's choices, without typer's backslashes
    before brackets."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        declared = {name: p.default for name, p in inspect.signature(self.callback).parameters.items()} if self.callback else {}
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            if isinstance(param, click.Argument) and not param.help:  # click >= 8.3 drops typer's argument help
                param.help = getattr(declared.get(param.name or ""), "help", None)
            record = param.get_help_record(ctx)
            if record is None:
                continue
            name, text = record
            text = _with_late_help(param, text.replace("\\[", "["))
            default_panel = "Arguments" if isinstance(param, click.Argument) else "Options"
            sections.setdefault(getattr(param, "rich_help_panel", None) or default_panel, []).append((name, text))
        for title, rows in sections.items():
            with formatter.section(title):
                _write_rows(formatter, rows)


#: The widest first column of the help's rows; a longer option name gets a line of its own.
HELP_NAME_WIDTH = 30


def _write_rows(formatter: click.HelpFormatter, rows: list[tuple[str, str]]) -> None:
    """Two columns as click's ``write_dl``, never breaking a line inside a hyphenated name (``ldp-sums``)."""
    first = min(max(len(name) for name, _ in rows), HELP_NAME_WIDTH)
    indent = " " * (formatter.current_indent + first + 2)
    width = max(formatter.width - len(indent), 20)
    for name, text in rows:
        lead = " " * formatter.current_indent + name  # a name longer than the column gets its own line
        lead = lead + " " * (len(indent) - len(lead)) if len(name) <= first else f"{lead}\n{indent}"
        lines = textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False) or [""]
        formatter.write(lead + f"\n{indent}".join(lines) + "\n")


def _with_late_help(param: click.Parameter, text: str) -> str:
    """``text`` with the parameter's registry sentence (its choices, ...) before its ``[default: ...]``."""
    extra = []
    if isinstance(param.type, RegistryChoice):
        extra.append(f"One of: {', '.join(param.type.choices)}.")
    if param.name in LATE_HELP:
        extra.append(LATE_HELP[param.name]())
    if not extra:
        return text
    head, bracket, tail = text.partition("  [" if "  [" in text else " [default: ")
    return f"{head} {' '.join(extra)}{bracket}{tail}"
