"""What `--checkpoint-every 1` costs on the default run, against saving only at the end.

Two measurements:

- one resume point alone: the default run's server state written with
  :func:`privfed.resume.write_resume_point`, timed over ``--saves`` writes, and
  its size;
- the default run end to end (``privfed train``'s defaults), once with
  ``checkpoint_every=1`` and once with ``0`` (only at a stop and the end),
  per seed, the two interleaved so that both see the same machine load.

    python benchmarks/checkpoint_overhead.py
    python benchmarks/checkpoint_overhead.py --seeds 0 1 2 --rounds 6
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from privfed.config import build_config
from privfed.federation.simulation import simulate
from privfed.models.network import build_network
from privfed.resume import RESUME_FILE, ResumePoint, write_resume_point
from privfed.run_plan import plan_run
from privfed.runs import RunDirectory


def time_one_save(saves: int, folder: Path) -> tuple[float, int]:
    """Median seconds to write the default run's resume point, and its size in bytes."""
    config = build_config(out=str(folder / "save"), device="cpu")
    run_dir = RunDirectory(folder / "save")
    run_dir.checkpoints.mkdir(parents=True)
    network = build_network(config)
    point = ResumePoint(
        round=1, network=network.state_dict(), centroids=None, initialised=True, server_generator=None,
        runtime={}, driver={},
    )
    seconds = []
    for _ in range(saves):
        started = time.perf_counter()
        write_resume_point(run_dir, point)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), (run_dir.checkpoints / RESUME_FILE).stat().st_size


def wall_seconds(every: int, seed: int, rounds: int | None, folder: Path) -> float:
    out = folder / f"every{every}-seed{seed}"
    overrides = {} if rounds is None else {"rounds": rounds}
    summary = simulate(plan_run(build_config(checkpoint_every=every, seed=seed, out=str(out), device="cpu", **overrides)))
    return float(summary["wall_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=None, help="override the default run's rounds")
    parser.add_argument("--saves", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save_s, size = time_one_save(args.saves, folder)
        rows = [(seed, wall_seconds(1, seed, args.rounds, folder), wall_seconds(0, seed, args.rounds, folder))
                for seed in args.seeds]
    rounds = args.rounds or build_config().rounds
    print(f"one resume point: {save_s * 1000:.1f} ms (median of {args.saves}), {size / 1e6:.2f} MB; "
          f"{rounds} rounds -> {rounds * save_s:.2f} s of writes per run")
    print(f"{'seed':>4} {'every 1 (s)':>11} {'at end (s)':>10} {'difference':>10}")
    for seed, every1, at_end in rows:
        print(f"{seed:>4} {every1:>11.1f} {at_end:>10.1f} {every1 - at_end:>+10.1f}")
    differences = [every1 - at_end for _, every1, at_end in rows]
    spread = statistics.stdev(differences) if len(differences) > 1 else 0.0
    print(f"mean difference {statistics.fmean(differences):+.1f} s ± {spread:.1f} (std over {len(rows)} seeds), "
          f"{statistics.fmean(d / a for d, (_, _, a) in zip(differences, rows)) * 100:+.1f} % of the run")


if __name__ == "__main__":
    main()
