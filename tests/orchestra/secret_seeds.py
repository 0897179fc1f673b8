"""DP-SGD's secret seeds held fixed, for tests that must repeat a round exactly.

The package draws them from the operating system (``secrets.randbits`` in
:mod:`privfed.orchestra.dp_sgd_training`) and takes no seed for them, so a
seed the server knows can never reach them by mistake; tests replace that
module's ``secrets`` instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

import privfed.orchestra.dp_sgd_training as dp_sgd_training


@contextmanager
def fixed_secret_seeds(seed: int) -> Iterator[None]:
    """Inside, every DP-SGD round seeds its batch sampling with ``seed`` and its noise with ``seed + 1``."""
    drawn = itertools.cycle((seed, seed + 1))  # dp_sgd_parts draws the sampling seed, then the noise seed
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dp_sgd_training, "secrets", SimpleNamespace(randbits=lambda bits: next(drawn)))
        yield
