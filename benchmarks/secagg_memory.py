"""Peak memory of one SecAgg+ round in-process against the number of clients.

Each client count runs in a fresh subprocess (the harness's direct grid, no
Ray, every client sending a fixed update of the backbone's size) and reports
``ru_maxrss``: after setup (imports and the one shared update), and after
the round. The harness builds each client's reply in the same process, but
one at a time and without keeping the masked vectors, so its own share is
constant in the number of clients: what grows with clients is what the
server holds.

    python benchmarks/secagg_memory.py --backbone resnet8
    python benchmarks/secagg_memory.py --backbone resnet18 --clients 10 25 50
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for the benchmarks package


def peak_mb() -> float:
    """This process's peak resident set so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_round(backbone: str, num_clients: int) -> dict:
    """One in-process round of ``num_clients`` clients; the peak RSS before and after it."""
    import numpy as np
    from flwr.supercore.task_identity import TaskIdentity
    from secagg_round import update_shapes  # this script's folder is on the path

    from benchmarks.secagg_harness import run_round
    from privfed.secagg.settings import default_num_shares, default_threshold

    logging.getLogger("flwr").setLevel(logging.WARNING)
    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        setattr(TaskIdentity, name, value)  # the harness builds Flower messages outside a Flower task
    shapes = update_shapes(backbone, argparse.Namespace(samples_per_client=32, rounds=2))
    rng = np.random.default_rng(0)
    update = [rng.uniform(-0.1, 0.1, shape).astype(np.float32) for shape in shapes]
    updates = {100 + i: (update, 100) for i in range(num_clients)}  # one array set shared by all clients
    shares = default_num_shares(num_clients)
    before = peak_mb()
    start = time.perf_counter()
    outcome = run_round(updates, shares=shares, threshold=default_threshold(shares), record_masked=False)
    if not outcome.completed:
        raise RuntimeError(f"the round with {num_clients} clients did not complete")
    return {
        "backbone": backbone, "clients": num_clients, "values": int(sum(np.prod(s) for s in shapes)),
        "setup_mb": before, "peak_mb": peak_mb(), "round_s": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="resnet8", choices=["resnet8", "resnet18"])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 25, 50])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the subprocess: one client count, JSON out
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_round(args.backbone, args.one)))
        return
    print(f"peak RSS of one in-process SecAgg+ round, {args.backbone}, each client count in a fresh process")
    print(f"{'clients':>7} {'values':>11} {'setup MB':>9} {'peak MB':>9} {'round MB':>9} {'round s':>8}", flush=True)
    for num_clients in args.clients:
        out = subprocess.run(
            [sys.executable, __file__, "--backbone", args.backbone, "--one", str(num_clients)],
            check=True, stdout=subprocess.PIPE, text=True,
        ).stdout
        row = json.loads(out.strip().splitlines()[-1])
        print(f"{row['clients']:>7} {row['values']:>11,} {row['setup_mb']:>9.0f} {row['peak_mb']:>9.0f} "
              f"{row['peak_mb'] - row['setup_mb']:>9.0f} {row['round_s']:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
