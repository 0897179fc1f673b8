"""``benchmarks/gpu/round_split.py``: its timers count only their own time, and they find every function they time."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from tests.benchmarks.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "round_split.py"


@pytest.fixture(scope="module")
def split():
    return load_script("round_split", SCRIPT)


class Clock:
    """A perf_counter that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_timer_counts_its_own_time_less_the_timers_inside_it(split, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(split.time, "perf_counter", clock)
    waited = []
    watch = split.Stopwatch(wait=lambda: waited.append(clock.now))

    def advance(seconds, inner=None):
        clock.now += seconds
        if inner is not None:
            inner()
        clock.now += seconds

    def train_locally():
        advance(1.0)

    train = watch.wrap("train", train_locally)

    def fit():
        advance(0.5, train)

    client = watch.wrap("client", fit)

    def privfed_secaggplus_mod():
        advance(2.0, client)

    watch.wrap("secagg", privfed_secaggplus_mod)()
    before = watch.snapshot()
    train()
    assert before == {"seconds": {"train": 2.0, "client": 1.0, "secagg": 4.0},
                      "calls": {"train_locally": 1, "fit": 1, "privfed_secaggplus_mod": 1}}
    assert split.since(watch.snapshot(), before) == {
        "seconds": {"train": 2.0, "client": 0.0, "secagg": 0.0}, "calls": {"train_locally": 1, "fit": 0, "privfed_secaggplus_mod": 0}
    }
    assert waited == [4.5, 9.0]  # training waits for the GPU before its timer stops


def test_a_timer_stops_when_its_function_raises(split):
    watch = split.Stopwatch()

    def fails():
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        watch.wrap("train", fails)()
    assert watch.calls["fails"] == 1 and watch._stack() == []


def test_a_function_is_replaced_wherever_it_was_imported_by_name_and_put_back(split, monkeypatch):
    home, user = types.ModuleType("fake_home"), types.ModuleType("fake_user")

    def work():
        return 1

    class Worker:
        def run(self):
            return 2

    home.work, home.Worker, user.work = work, Worker, work
    monkeypatch.setitem(sys.modules, "fake_home", home)
    monkeypatch.setitem(sys.modules, "fake_user", user)
    wrap = lambda original: lambda *args: 10 * original(*args)
    restore_function = split.replace("fake_home", "work", wrap)
    restore_method = split.replace("fake_home", "Worker.run", wrap)
    assert (home.work(), user.work(), Worker().run()) == (10, 10, 20)
    restore_function()
    restore_method()
    assert (home.work, user.work, Worker().run()) == (work, work, 2)
    assert split.replace("fake_home", "gone", wrap) is None
    assert split.replace("fake_home", "Nobody.run", wrap) is None
    assert split.replace("no_such_module_here", "work", wrap) is None


def test_every_timed_function_exists_in_privfed(split, tmp_path):
    """A renamed function would silently move its time into "rest": the timers must find all of them."""
    out = tmp_path / "split.jsonl"
    missing, undo = split.install(split.Stopwatch(), out)
    try:
        assert missing == []
        from privfed.orchestra import cohort_training
        from privfed.run.driver import RunDriver

        assert cohort_training.train_cohort.__wrapped__.__name__ == "train_cohort"
        with pytest.raises(AttributeError):  # no driver behind it; its round's line is written all the same
            RunDriver.on_round_end(object(), types.SimpleNamespace(round=3))
        line = json.loads(out.read_text())
        assert line["event"] == "round" and line["round"] == 3 and line["wall_s"] > 0
        assert line["seconds"] == {} and line["calls"] == {}
    finally:
        undo()
    assert not hasattr(cohort_training.train_cohort, "__wrapped__")
