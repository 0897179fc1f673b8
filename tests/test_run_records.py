"""The run-comparison helper itself: a difference it misses would make determinism tests pass vacuously."""

from __future__ import annotations

from tests.run_records import same


def test_numbers_compare_up_to_rounding_and_everything_else_exactly():
    assert same({"task": "init", "loss": 1.0, "ids": [1, 2]}, {"task": "init", "loss": 1.0 + 1e-9, "ids": [1, 2]})
    assert same(float("nan"), float("nan"))
    assert not same({"task": "init"}, {"task": "train"})
    assert not same(1.0, 1.01)
    assert not same([1, 2], [1, 2, 3])
    assert not same({"a": 1}, {"b": 1})
    assert not same(None, 0.0) and not same(True, 1)
