"""privfed: privacy-focused federated learning around Orchestra.

The training core lives here (data, models, Orchestra, evaluation, the Flower
apps and the CLI); centroid-release mechanisms live in the sibling package
:mod:`mechanisms` and inversion attacks in :mod:`attacks`.

The Python API (:mod:`privfed.api`) is importable from here::

    import privfed
    run = privfed.train(privfed.TrainConfig(dataset="shapes:1000", rounds=2), out="runs/first")
    privfed.evaluate(run, protocol="knn")

Its names load on first use, so ``import privfed`` stays cheap (``privfed --version`` imports it).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("privfed")  # pyproject.toml's, the one place it is written
except PackageNotFoundError:  # sources used without installing them
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from privfed.api import Run, attack, evaluate, load_encoder, study, train, tune
    from privfed.config import TrainConfig
    from privfed.errors import PrivfedError

#: The public names, and the module each one comes from.
_API = {**dict.fromkeys(("Run", "attack", "evaluate", "load_encoder", "study", "train", "tune"), "privfed.api"),
        "TrainConfig": "privfed.config", "PrivfedError": "privfed.errors"}

__all__ = [
    "PrivfedError", "Run", "TrainConfig", "__version__", "attack", "evaluate", "load_encoder", "study", "train", "tune",
]


def __getattr__(name: str) -> Any:
    """Loads a public name on first use (PEP 562)."""
    if name not in _API:
        raise AttributeError(f"module 'privfed' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
