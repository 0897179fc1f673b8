"""Run configuration: one flat, typed record, loadable from TOML.

Every field is also a ``privfed train`` option of the same name (dashes for
underscores); precedence is defaults < ``--config`` file < command line.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_type_hints

from privfed.errors import PrivfedError

METHODS = {"orchestra": "Orchestra: clustering-based federated self-supervised learning"}
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run (the CLI's ``--help`` documents each field)."""

    # data
    dataset: str = "shapes"
    test_dataset: str | None = None
    data_dir: str = "data"
    download: bool = False
    num_clients: int = 10
    participation: float = 0.5
    alpha: float = 0.1
    # model
    method: str = "orchestra"
    backbone: str = "resnet8"
    projection_dim: int = 32
    # Orchestra
    rounds: int = 12
    local_epochs: int = 2
    batch_size: int = 32
    lr: float = 0.03
    momentum: float = 0.9
    weight_decay: float = 1e-4
    temperature: float = 0.3
    ema_decay: float = 0.99
    memory_size: int = 128
    num_local_centroids: int = 8
    num_global_centroids: int = 16
    # release mechanism and privacy budget
    mechanism: str = "kanon"
    epsilon: float | None = None
    delta: float | None = None
    epsilon_per_release: float | None = None
    # secure aggregation of model updates (Flower SecAgg+)
    secagg: bool = True
    secagg_shares: int | None = None
    secagg_threshold: int | None = None
    secagg_clipping_range: float = 8.0
    secagg_timeout: float | None = None
    # DP-SGD on clients (Opacus)
    dp_sgd: bool = False
    max_grad_norm: float = 1.0
    dp_sgd_noise_multiplier: float | None = None
    dp_sgd_epsilon: float | None = None
    # run
    seed: int = 0
    device: str = "auto"
    out: str | None = None
    eval_every: int = 1
    knn_k: int = 200
    knn_temperature: float = 0.1
    client_cpus: float = 1.0
    client_gpus: float = 0.0

    @property
    def clients_per_round(self) -> int:
        """Clients sampled each round: ``max(1, round(R * K))``."""
        return max(1, round(self.participation * self.num_clients))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


def _field_types() -> dict[str, Any]:
    hints = get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in fields(TrainConfig)}


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """Checks a TOML value against the field's type (ints are accepted for floats)."""
    allowed = getattr(hint, "__args__", (hint,))
    if value is None and type(None) in allowed:
        return None
    for kind in allowed:
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is not type(None) and type(value) is kind:
            return value
    names = " or ".join(getattr(k, "__name__", str(k)) for k in allowed)
    raise PrivfedError(f"config key {name!r} must be {names}, got {value!r}")


def load_config_file(path: Path) -> dict[str, Any]:
    """Reads a TOML preset into config overrides (unknown keys are errors)."""
    if not path.is_file():
        raise PrivfedError(f"config file not found: {path}")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise PrivfedError(f"config file {path} is not valid TOML: {err}") from None
    types = _field_types()
    unknown = sorted(set(raw) - set(types))
    if unknown:
        raise PrivfedError(f"config file {path} has unknown keys: {', '.join(unknown)}")
    return {key: _coerce(key, value, types[key]) for key, value in raw.items()}


def build_config(file: Path | None = None, **overrides: Any) -> TrainConfig:
    """Defaults, then the file, then explicit overrides (``None`` = not given)."""
    values: dict[str, Any] = {}
    if file is not None:
        values.update(load_config_file(file))
    values.update({k: v for k, v in overrides.items() if v is not None})
    config = TrainConfig(**values)
    validate(config)
    return config


def validate(config: TrainConfig) -> None:
    """Rejects settings that cannot run, with a message naming the problem."""
    positive_ints = (
        "num_clients", "rounds", "local_epochs", "batch_size", "memory_size",
        "num_local_centroids", "num_global_centroids", "projection_dim", "eval_every", "knn_k",
    )
    for name in positive_ints:
        if getattr(config, name) < 1:
            raise PrivfedError(f"{name} must be at least 1, got {getattr(config, name)}")
    if config.batch_size < 2:
        raise PrivfedError("batch_size must be at least 2 (BatchNorm needs two samples)")
    if config.alpha <= 0:
        raise PrivfedError(f"alpha must be > 0, got {config.alpha}")
    if not 0 < config.participation <= 1:
        raise PrivfedError(f"participation must be in (0, 1], got {config.participation}")
    if config.lr <= 0:
        raise PrivfedError(f"lr must be > 0, got {config.lr}")
    if config.temperature <= 0 or config.knn_temperature <= 0:
        raise PrivfedError("temperatures must be > 0")
    if not 0 <= config.ema_decay < 1:
        raise PrivfedError(f"ema_decay must be in [0, 1), got {config.ema_decay}")
    if config.method not in METHODS:
        raise PrivfedError(f"unknown method {config.method!r} (choose from {', '.join(METHODS)})")
    from mechanisms import UnknownMechanismError, get_mechanism_class

    try:
        get_mechanism_class(config.mechanism)
    except UnknownMechanismError as err:
        raise PrivfedError(str(err)) from None
    for name in ("epsilon", "epsilon_per_release"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise PrivfedError(f"{name} must be > 0, got {value}")
    if config.delta is not None and not 0 < config.delta < 1:
        raise PrivfedError(f"delta must be in (0, 1), got {config.delta}")
    if config.device not in DEVICES:
        raise PrivfedError(f"unknown device {config.device!r} (choose from {', '.join(DEVICES)})")
    if config.num_local_centroids > config.memory_size:
        raise PrivfedError(
            f"num_local_centroids ({config.num_local_centroids}) cannot exceed memory_size ({config.memory_size})"
        )
    released = config.clients_per_round * config.num_local_centroids
    if config.mechanism != "reps" and released < config.num_global_centroids:
        raise PrivfedError(
            f"{config.clients_per_round} sampled clients x {config.num_local_centroids} local centroids "
            f"= {released} released centroids, fewer than num_global_centroids ({config.num_global_centroids}); "
            "raise participation or num_clients, or lower num_global_centroids"
        )


def save_config(config: TrainConfig, path: Path) -> None:
    path.write_text(json.dumps(config.to_dict(), indent=2) + "\n")


def load_saved_config(path: Path) -> TrainConfig:
    """Reads a run directory's ``config.json`` back."""
    return TrainConfig(**json.loads(path.read_text()))
