"""The SecAgg+ harness's test side: a fixture for running it in-process, and clients that drop at a stage.

The harness itself (:func:`benchmarks.secagg_harness.run_round`) is shared
with the SecAgg+ benchmarks, which import nothing from tests.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flwr.app import Message
from flwr.supercore.task_identity import TaskIdentity

from benchmarks.secagg_harness import Behaviour
from tests.secagg.flower_prg import replace_flowers_prg


@pytest.fixture
def in_process_secagg(monkeypatch):
    """Lets the harness build Flower messages outside a Flower task, and makes any call of Flower's own mask PRG fail."""
    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)
    replace_flowers_prg(monkeypatch)


def drops_at(stage: str) -> Behaviour:
    def behaviour(current: str, honest: Callable[[], Message]) -> Message:
        if current == stage:
            raise RuntimeError(f"dropped at {stage}")
        return honest()

    return behaviour
