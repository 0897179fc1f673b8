"""A study's cells: a base preset, grids over training options, and seeds, from one TOML file (docs/studies.md).

Every cell's configuration is built, and so checked, when the study is read: a typo fails before a cell trains.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privfed.config import TrainConfig, build_config, checked_options, read_toml, resolve_preset
from privfed.errors import PrivfedError

#: TrainConfig fields that say where things go, not what a cell computes: left out of its configuration hash
#: (``out`` is the cell's own folder; a moved data folder or a download permission changes no result).
UNHASHED_FIELDS = ("out", "data_dir", "download")

#: Keys of a study file besides its tables.
STUDY_KEYS = ("preset", "seeds", "base", "grid", "attack", "attack_settings", "finetune")


@dataclass(frozen=True)
class Cell:
    """One setting of a study (a filesystem-safe ``name``, the options it sets over preset and base), at one seed."""

    name: str
    overrides: dict[str, Any]
    seed: int
    config: TrainConfig

    @property
    def run_name(self) -> str:
        return f"{self.name}-seed{self.seed}"


@dataclass(frozen=True)
class Study:
    """A study file, read and checked."""

    path: Path
    preset: Path | None
    seeds: tuple[int, ...]
    base: dict[str, Any]
    grids: tuple[dict[str, list[Any]], ...]
    attack: str | None
    attack_settings: dict[str, Any] = field(default_factory=dict)
    finetune: tuple[float, ...] = ()

    @classmethod
    def load(cls, path: Path | str, *, overrides: dict[str, Any] | None = None) -> Study:
        """Reads a study file (a path, or a shipped study's name), ``overrides`` over its ``[base]`` (None: not given).

        Raises:
            PrivfedError: naming what is wrong (unknown keys or options, empty lists, bad TOML).
        """
        path = resolve_preset(path, kind="study")
        raw = read_toml(path, kind="study file")
        unknown = sorted(set(raw) - set(STUDY_KEYS))
        if unknown:
            raise PrivfedError(f"study file {path} has unknown keys: {', '.join(unknown)} (expected {', '.join(STUDY_KEYS)})")
        seeds = raw.get("seeds", [0])
        if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
            raise PrivfedError(f"study file {path}: seeds must be a non-empty list of integers")
        repeated = sorted({s for s in seeds if seeds.count(s) > 1})
        if repeated:  # one run would count twice in a setting's mean, and shrink its std
            raise PrivfedError(f"study file {path}: seeds lists {', '.join(map(str, repeated))} more than once")
        grids = raw.get("grid", [{}])
        if not isinstance(grids, list) or not all(isinstance(g, dict) for g in grids):
            raise PrivfedError(f"study file {path}: write each grid as a [[grid]] table")
        for grid in grids:
            for option, values in grid.items():
                if not isinstance(values, list) or not values:
                    raise PrivfedError(f"study file {path}: grid option {option} must be a non-empty list")
        if not isinstance(raw.get("base", {}), dict):
            raise PrivfedError(f"study file {path}: write the options every cell shares as a [base] table")
        for key in ("preset", "attack"):
            if key in raw and not isinstance(raw[key], str):
                raise PrivfedError(f"study file {path}: {key} must be a string, got {raw[key]!r}")
        for table in (raw.get("base", {}), *grids):
            if "seed" in table:
                raise PrivfedError(f"study file {path}: set seeds with the top-level `seeds` list, not as an option")
        base = checked_options(raw.get("base", {}), source=f"study file {path}, [base]", relative_to=path.parent)
        base.update({k: v for k, v in (overrides or {}).items() if v is not None})
        checked_grids = tuple(
            {option: [checked_options({option: v}, source=f"study file {path}, [[grid]]", relative_to=path.parent)[option]
                      for v in values]
             for option, values in grid.items()}
            for grid in grids
        )
        attack_settings = raw.get("attack_settings", {})
        if not isinstance(attack_settings, dict):
            raise PrivfedError(f"study file {path}: write attack_settings as an [attack_settings] table")
        if "seed" in attack_settings:
            raise PrivfedError(
                f"study file {path}: [attack_settings] takes no seed (a study attacks with seed 0, privfed attack's default)"
            )
        if attack_settings and raw.get("attack") is None:
            raise PrivfedError(f"study file {path}: attack_settings without an attack (set attack = \"decoder\", say)")
        finetune = raw.get("finetune", [])
        if not isinstance(finetune, list) or not all(
            isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1 for f in finetune
        ):
            raise PrivfedError(f"study file {path}: finetune must be a list of label fractions in (0, 1], e.g. [0.01, 0.1]")
        preset = raw.get("preset")
        return cls(
            path=path,
            preset=None if preset is None else resolve_preset(preset, relative_to=path.parent),
            seeds=tuple(seeds),
            base=base,
            grids=checked_grids,
            attack=raw.get("attack"),
            attack_settings=attack_settings,
            finetune=tuple(float(f) for f in dict.fromkeys(finetune)),
        )

    def cells(self) -> list[Cell]:
        """Every (setting, seed) of the study, grid by grid, seeds innermost; each configuration built and checked."""
        cells = []
        seen: set[str] = set()
        for grid in self.grids:
            options = list(grid)
            for values in itertools.product(*(grid[o] for o in options)):
                overrides = dict(zip(options, values))
                name = cell_name(overrides)
                if name in seen:
                    raise PrivfedError(f"study file {self.path}: the setting {name} appears twice")
                seen.add(name)
                for seed in self.seeds:
                    try:
                        config = build_config(self.preset, **{**self.base, **overrides, "seed": seed})
                    except (PrivfedError, TypeError, ValueError) as err:
                        raise PrivfedError(f"study file {self.path}, cell {name}: {err}") from None
                    cells.append(Cell(name, overrides, seed, config))
        return cells

    def cell_settings(self, cell: Cell) -> dict[str, Any]:
        """What a cell's results depend on: its configuration (less :data:`UNHASHED_FIELDS`), the fine-tuning
        fractions, and the attack and its settings when the cell releases something (else it is not attacked)."""
        train = {key: value for key, value in cell.config.to_dict().items() if key not in UNHASHED_FIELDS}
        settings: dict[str, Any] = {"train": train, "finetune": list(self.finetune)}
        if self.attack is not None and cell.config.release_mechanism is not None:
            settings.update(attack=self.attack, attack_settings=self.attack_settings)
        return json.loads(json.dumps(settings, default=str))  # as cell.json keeps it: lists, not tuples


def settings_hash(settings: dict[str, Any]) -> str:
    """A hash of a cell's settings that is the same in every process (sorted JSON and SHA-256, never ``hash()``)."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def settings_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """``rounds: 40 -> 20`` for each setting that differs (nested tables by dotted name; ``train.`` left out)."""
    changes = []
    for key in sorted(set(old) | set(new)):
        name = f"{prefix}{key}"
        before, after = old.get(key), new.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            changes += settings_changes(before, after, "" if name == "train" else f"{name}.")
        elif before != after:
            changes.append(f"{name}: {_short(before) if key in old else '(unset)'} -> {_short(after) if key in new else '(unset)'}")
    return changes


def setting_label(overrides: dict[str, Any]) -> str:
    """A setting's name for a person: ``ldp, ε=0.8`` for ``{"mechanism": "ldp", "epsilon": 0.8}``, ``lr=0.1``,
    ``dp_sgd on``; ``base`` for none."""
    parts = []
    for option, value in overrides.items():
        if option in ("method", "mechanism"):
            parts.append(str(value))
        elif option == "epsilon":
            parts.append(f"ε={_short(value)}")
        elif isinstance(value, bool):
            parts.append(f"{option} {_short(value)}")
        else:
            parts.append(f"{option}={_short(value)}")
    return ", ".join(parts) or "base"


#: The longest cell name: with ``-seed<seed>`` it stays a usable folder name (255 bytes at most).
MAX_CELL_NAME = 200


def cell_name(overrides: dict[str, Any]) -> str:
    """``mechanism-ldp_epsilon-1`` for ``{"mechanism": "ldp", "epsilon": 1.0}``; ``base`` for no overrides.

    A name over :data:`MAX_CELL_NAME` is cut and ends in a hash of the whole: a folder name, and distinct.
    """
    if not overrides:
        return "base"
    joined = "_".join(f"{option}-{_short(value)}" for option, value in overrides.items())
    name = re.sub(r"[^A-Za-z0-9._=-]+", "-", joined)
    if len(name) <= MAX_CELL_NAME:
        return name
    return f"{name[:MAX_CELL_NAME - 13]}-{hashlib.sha256(joined.encode()).hexdigest()[:12]}"


def _short(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
