"""``privfed train`` with stopwatches on local training, SecAgg+ and the kNN monitor: where each round's time went.

When a round's clients train as one batched step their ``train_seconds`` overlap,
so ``metrics.jsonl`` cannot split a round into training and the rest. This runs
privfed's CLI in this process with a timer around each function that does one kind
of work (:data:`TIMED`), and appends one JSON line per round to ``--split-out``:
the wall time since the previous round ended and the seconds each kind took in it. Timers nest and count
only their own time: SecAgg+'s server stages do not count the clients they wait
for, a client's fit inside the SecAgg+ mod is not SecAgg+, and training is
training wherever it is called from. A timer around training waits for the GPU
before it stops. A function that is not found (renamed) is listed as ``missing``
in the first line, and its time falls to whatever encloses it.

    python benchmarks/gpu/round_split.py --split-out split.jsonl -- train --config quick --runtime local
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: (kind, module, attribute): what each timer wraps. "client" and "server" only stop the kinds around them.
TIMED = (
    ("train", "privfed.orchestra.client_update", "train_locally"),
    ("train", "privfed.orchestra.cohort_training", "train_cohort"),
    ("secagg", "privfed.secagg.client_mod", "privfed_secaggplus_mod"),
    ("secagg", "privfed.secagg.client_encoding", "prepare_for_secagg"),
    ("secagg", "privfed.secagg.workflow", "_CapturingSecAggPlusWorkflow.setup_stage"),
    ("secagg", "privfed.secagg.workflow", "_CapturingSecAggPlusWorkflow.share_keys_stage"),
    ("secagg", "privfed.secagg.workflow", "_CapturingSecAggPlusWorkflow.collect_masked_vectors_stage"),
    ("secagg", "privfed.secagg.workflow", "_CapturingSecAggPlusWorkflow.unmask_stage"),
    ("knn", "privfed.evaluation.monitor", "KnnMonitor.__call__"),
    ("client", "privfed.federation.local_runtime", "LocalGrid._deliver"),
    ("client", "privfed.federation.client", "OrchestraClient.fit"),
    ("server", "privfed.federation.strategy", "OrchestraStrategy.aggregate_fit"),
)
ROUND_END = ("privfed.run.driver", "RunDriver.on_round_end")


class Stopwatch:
    """Seconds per kind, each timer's time less the time of the timers inside it, and calls per function."""

    def __init__(self, wait: Callable[[], None] = lambda: None) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self.wait = wait  # run before a "train" timer stops (the GPU's queue)
        self._local = threading.local()

    def wrap(self, kind: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = self._stack()
            stack.append(0.0)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if kind == "train":
                    self.wait()
                elapsed = time.perf_counter() - start
                self.seconds[kind] += elapsed - stack.pop()
                self.calls[function.__name__] += 1
                if stack:
                    stack[-1] += elapsed

        return timed

    def _stack(self) -> list[float]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack  # type: ignore[no-any-return]

    def snapshot(self) -> dict[str, Any]:
        return {"seconds": dict(self.seconds), "calls": dict(self.calls)}


def since(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The seconds and calls of each kind between two snapshots."""
    return {field: {k: v - before[field].get(k, 0) for k, v in now[field].items()} for field in ("seconds", "calls")}


def replace(module_name: str, attribute: str, make: Callable[[Any], Any]) -> Callable[[], None] | None:
    """Puts ``make(original)`` where ``module.attribute`` was, and in every loaded module bound to the original.

    ``Class.method`` names a method (replaced on its class). Returns what puts the
    originals back, or None when the attribute does not exist.
    """
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError:
        return None
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    original = getattr(owner, name, None) if owner is not None else None
    if original is None:
        return None
    wrapped = make(original)
    owners = [owner]
    if not path:  # a function other modules may have imported by name
        owners += [m for m in list(sys.modules.values()) if m is not owner and getattr(m, "__dict__", {}).get(name) is original]
    for each in owners:
        setattr(each, name, wrapped)

    def restore() -> None:
        for each in owners:
            setattr(each, name, original)

    return restore


def install(watch: Stopwatch, out: Path) -> tuple[list[str], Callable[[], None]]:
    """Wraps every :data:`TIMED` function and the driver's round end (which appends a line to ``out``).

    Returns the targets not found, and what undoes the wrapping.
    """
    missing: list[str] = []
    restores: list[Callable[[], None]] = []
    for kind, module, attribute in TIMED:
        restore = replace(module, attribute, functools.partial(watch.wrap, kind))
        if restore is None:
            missing.append(f"{module}:{attribute}")
        else:
            restores.append(restore)
    previous, previous_at = watch.snapshot(), time.perf_counter()

    def round_end(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def logged(driver: Any, report: Any) -> Any:
            nonlocal previous, previous_at
            try:
                return original(driver, report)
            finally:  # the round's wall time over the same span as its timers (round 0's from the install)
                now, now_at = watch.snapshot(), time.perf_counter()
                line = {"event": "round", "round": report.round, "wall_s": now_at - previous_at, **since(now, previous)}
                with open(out, "a") as sink:
                    sink.write(json.dumps(line) + "\n")
                previous, previous_at = now, now_at

        return logged

    restore = replace(*ROUND_END, round_end)
    if restore is None:
        missing.append(":".join(ROUND_END))
    else:
        restores.append(restore)

    def undo() -> None:
        for each in reversed(restores):
            each()

    return missing, undo


def _wait_for_gpu() -> None:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split-out", type=Path, required=True, help="JSON lines: the timers, then one per round")
    parser.add_argument("privfed_args", nargs=argparse.REMAINDER, help="-- then privfed's arguments (train ...)")
    args = parser.parse_args(argv)
    privfed_args = args.privfed_args[1:] if args.privfed_args[:1] == ["--"] else args.privfed_args
    import privfed.cli

    watch = Stopwatch(_wait_for_gpu)
    args.split_out.write_text("")
    missing, _ = install(watch, args.split_out)
    with open(args.split_out, "a") as sink:
        sink.write(json.dumps({"event": "timers", "timed": [list(t) for t in TIMED], "missing": missing}) + "\n")
    sys.argv = ["privfed", *privfed_args]
    privfed.cli.main()


if __name__ == "__main__":
    main()
