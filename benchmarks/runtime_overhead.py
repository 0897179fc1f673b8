"""What a `privfed train` process costs beyond its rounds, on the local and the Ray runtime.

Runs the tiny run of issue 32 (``shapes:300``, 4 clients all sampled, 2
rounds, resnet8) as a real ``privfed train`` subprocess per runtime, and
prints the process's wall time against the sum of its rounds' times
(``round_seconds`` in metrics.jsonl), split by when the process printed
its first line (imports, planning), its ``done:`` line, and exited
(shutdown). ``--default`` also times the default run (``privfed train``).
The goal (issue 32): the tiny run at most 1.2 times its rounds on the
local runtime.

    python benchmarks/runtime_overhead.py --repeat 2 --default
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "--dataset", "shapes:300", "-K", "4", "-R", "1.0", "--backbone", "resnet8", "--projection-dim", "16",
    "-E", "1", "--batch-size", "16", "--memory-size", "32", "-L", "4", "-G", "8", "-C", "2", "--device", "cpu",
]  # fmt: skip


@dataclass(frozen=True)
class Timing:
    """One process: its wall time, when it printed its first and its ``done:`` line, and its rounds' sum."""

    wall: float
    first_line: float
    done_line: float
    rounds: float

    @property
    def ratio(self) -> float:
        return self.wall / self.rounds


def timed_train(options: list[str], out: Path) -> Timing:
    """A `privfed train` subprocess of this checkout, timed from outside; its rounds read from its metrics.jsonl."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "privfed.cli", "train", *options, "--out", str(out)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    first = done = None
    for line in process.stdout:  # type: ignore[union-attr]
        now = time.perf_counter() - start
        first = now if first is None else first
        done = now if line.startswith("done:") else done
    if process.wait() != 0 or first is None or done is None:
        raise SystemExit(f"privfed train {' '.join(options)} failed (exit {process.returncode})")
    wall = time.perf_counter() - start
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return Timing(wall, first, done, sum(r["round_seconds"] for r in records))


def row(name: str, runtime: str, t: Timing) -> str:
    return (
        f"| {name} | {runtime} | {t.wall:.1f} | {t.rounds:.1f} | {t.ratio:.2f} | {t.first_line:.1f} | "
        f"{t.done_line - t.first_line - t.rounds:.1f} | {t.wall - t.done_line:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    parser.add_argument("--repeat", type=int, default=1, help="Tiny runs per runtime (alternating runtimes).")
    parser.add_argument("--default", action="store_true", help="Also time the default run once per runtime.")
    args = parser.parse_args()
    runs = [("tiny", TINY)] * args.repeat + ([("default", [])] if args.default else [])
    print("| run | runtime | process s | rounds s | ratio | to first line s | in run, not rounds s | after done s |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for i, (name, options) in enumerate(runs):
            for runtime in args.runtimes:
                timing = timed_train([*options, "--runtime", runtime], Path(folder) / f"{name}-{i}-{runtime}")
                print(row(name, runtime, timing), flush=True)


if __name__ == "__main__":
    main()
