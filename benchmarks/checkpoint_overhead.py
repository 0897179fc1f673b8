"""What `--checkpoint-every 1` (the default) costs on the default run.

The default run (``privfed train``'s defaults) is trained with a resume
point after every round, and the time spent writing them is measured inside
the run: the resume-point observer's :func:`privfed.run.resume.write_resume_point` is wrapped
in a timer. The overhead is that time over the run's wall time, so it does
not depend on how busy the machine is. ``--end-to-end`` also trains each
seed with ``checkpoint_every=0`` (only at a stop and the end), interleaved,
and compares wall times; that comparison needs an otherwise idle machine.

    python benchmarks/checkpoint_overhead.py
    python benchmarks/checkpoint_overhead.py --seeds 0 1 2 --end-to-end
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import privfed.run.observers.resume_point
from privfed.config import build_config
from privfed.federation.simulation import simulate
from privfed.run.plan import plan_run
from privfed.run.resume import RESUME_FILE, write_resume_point


class TimedWrites:
    """Wraps the resume-point observer's writer and adds up the seconds it takes."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Path:
        started = time.perf_counter()
        path = write_resume_point(*args, **kwargs)
        self.seconds.append(time.perf_counter() - started)
        return path


def train(every: int, seed: int, rounds: int | None, folder: Path) -> tuple[dict[str, Any], TimedWrites]:
    out = folder / f"every{every}-seed{seed}"
    timed = TimedWrites()
    privfed.run.observers.resume_point.write_resume_point = timed  # type: ignore[assignment]
    try:
        overrides = {} if rounds is None else {"rounds": rounds}
        summary = simulate(plan_run(build_config(checkpoint_every=every, seed=seed, out=str(out), device="cpu", **overrides)))
    finally:
        privfed.run.observers.resume_point.write_resume_point = write_resume_point  # type: ignore[assignment]
    summary["resume_point_bytes"] = (out / "checkpoints" / RESUME_FILE).stat().st_size
    return summary, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rounds", type=int, default=None, help="override the default run's rounds")
    parser.add_argument("--end-to-end", action="store_true", help="also train without per-round resume points")
    args = parser.parse_args()
    print(f"{'seed':>4} {'rounds':>6} {'writes':>6} {'write s':>8} {'ms/write':>8} {'MB':>5} {'run s':>7} {'overhead':>8}"
          + (f" {'run s (at end)':>14}" if args.end_to_end else ""))
    overheads = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            summary, timed = train(1, seed, args.rounds, Path(tmp))
            total, wall = sum(timed.seconds), summary["wall_seconds"]
            overheads.append(total / wall)
            line = (f"{seed:>4} {summary['rounds']:>6} {len(timed.seconds):>6} {total:>8.2f} "
                    f"{1000 * statistics.median(timed.seconds):>8.1f} {summary['resume_point_bytes'] / 1e6:>5.2f} "
                    f"{wall:>7.1f} {100 * total / wall:>7.2f}%")
            if args.end_to_end:
                line += f" {train(0, seed, args.rounds, Path(tmp))[0]['wall_seconds']:>14.1f}"
            print(line, flush=True)
    spread = statistics.stdev(overheads) if len(overheads) > 1 else 0.0
    print(f"overhead of a resume point every round: {100 * statistics.fmean(overheads):.2f}% ± {100 * spread:.2f} "
          f"of the run's wall time ({len(overheads)} seed{'s' if len(overheads) > 1 else ''})")


if __name__ == "__main__":
    main()
