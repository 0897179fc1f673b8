"""Optional dependencies: each feature that needs one says which ``pip install 'privfed[EXTRA]'`` brings it.

``privfed train`` needs none of them, so a deployment node or a minimal
install stays small; a feature that does need one stops with a one-line
:class:`PrivfedError` instead of an ``ImportError`` traceback.
"""

from __future__ import annotations

import importlib.util

from privfed.errors import PrivfedError

#: Importable module -> (its distribution, the privfed extra that installs it).
EXTRAS: dict[str, tuple[str, str]] = {
    "opacus": ("opacus", "dp-sgd"),
    "matplotlib": ("matplotlib", "plots"),
}


def require(module: str, *, feature: str) -> None:
    """Raises a :class:`PrivfedError` naming the extra when ``module`` is not installed; imports nothing.

    ``feature`` says what needs it, as the sentence's subject ("DP-SGD", "curves.png").
    """
    if importlib.util.find_spec(module) is not None:
        return
    package, extra = EXTRAS[module]
    raise PrivfedError(f"{feature} needs {package}: pip install 'privfed[{extra}]'")
