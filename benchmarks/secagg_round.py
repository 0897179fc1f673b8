"""Wall time of a SecAgg+ round with privfed's mask PRG and with Flower's, for 10 and 50 clients.

privfed's SecAgg+ expands every mask with HKDF-SHA256 and AES-256-CTR
(:mod:`privfed.secagg.masks`); Flower 1.41 uses a Mersenne Twister seeded
with 32 bits. To time the same round under Flower's PRG, this script swaps
Flower's function in for privfed's at both ends. Nothing else changes: same
message flow, same seeds, same data. Four tables:

1. One mask expansion, for each model's update size.
2. The protocol alone: one SecAgg+ round in this process (the test
   harness's direct grid, no Ray), every client sending a fixed update of
   the model's size. This is where the PRG's share of the time is largest.
3. An aggregated mechanism's table in the sum (``--share-tables``): the
   protocol round of table 2 under privfed's PRG with every client's masked
   vector also carrying a ``ddp-sums`` share of G x (D + 1) integers, against
   the same round without it.
4. Whole Orchestra rounds in Flower's simulation (``--sim-backbones``):
   every client sampled, one local epoch on a little data; a round is timed
   from client sampling to the aggregate being applied, the median over
   the training rounds (round 0, never secure, left out). ``none`` is the
   same run without SecAgg+.

Each setting runs ``--repeats`` times in alternating order; the table
gives the median and the range.

    python benchmarks/secagg_round.py
    python benchmarks/secagg_round.py --clients 10 --backbones resnet8 --sim-backbones --repeats 1
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import ray.cloudpickle
import torch
from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen

from privfed.config import build_config
from privfed.federation.simulation import simulate
from privfed.methods import build_network
from privfed.orchestra.model_state import shared_state
from privfed.run.directory import RunDirectory
from privfed.run.plan import plan_run
from privfed.secagg import mask_pool
from privfed.secagg.masks import expand_mask
from privfed.secagg.settings import default_num_shares, default_threshold

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for the benchmarks package
from benchmarks.secagg_harness import run_round

PRGS = ("none", "privfed", "flower")


def flower_expand(seed: bytes, modulus: int, shapes: list[tuple[int, ...]]) -> list:
    """Flower's mask expansion behind privfed's signature (the baseline only)."""
    return pseudo_rand_gen(seed, modulus, list(shapes))


def flower_add_masks(self, arrays: list, terms: list, modulus: int) -> list:
    """Flower's masks behind privfed's :meth:`MaskPool.add_masks`, summed in int64 as Flower's mod does (the baseline only)."""
    shapes = [np.shape(a) for a in arrays]
    total = [np.asarray(a).astype(np.int64) for a in arrays]
    for seed, sign in terms:
        for array, mask in zip(total, pseudo_rand_gen(seed, modulus, shapes)):
            array += sign * mask
    return [np.mod(array, modulus) for array in total]


def flowers_prg_in_client(msg, context, call_next):
    """Outer mod: this client process masks with Flower's PRG."""
    mask_pool.MaskPool.add_masks = flower_add_masks
    return call_next(msg, context)


@contextmanager
def flowers_prg_here() -> Iterator[None]:
    original = mask_pool.MaskPool.add_masks
    mask_pool.MaskPool.add_masks = flower_add_masks
    try:
        yield
    finally:
        mask_pool.MaskPool.add_masks = original


def config_for(num_clients: int, backbone: str, prg: str, args: argparse.Namespace, out: Path):
    return build_config(
        dataset=f"shapes:{num_clients * args.samples_per_client}",
        num_clients=num_clients,
        participation=1.0,
        alpha=1000.0,  # near-equal client sizes
        backbone=backbone,
        projection_dim=16,
        rounds=args.rounds,
        local_epochs=1,
        batch_size=16,
        memory_size=32,
        num_local_centroids=4,
        num_global_centroids=16,
        eval_every=args.rounds,
        secagg=prg != "none",
        report_client_metrics=True,  # the client train time column; 16 more values in the masked sum
        out=str(out),
        device="cpu",
    )


def run_one(num_clients: int, backbone: str, prg: str, args: argparse.Namespace, out: Path) -> dict:
    plan = plan_run(config_for(num_clients, backbone, prg, args, out))
    if prg == "flower":
        with flowers_prg_here():
            summary = simulate(plan, outer_mods=[flowers_prg_in_client])
    else:
        summary = simulate(plan)
    training_rounds = [m for m in RunDirectory(out).metrics() if m["round"] > 0]
    halted = sum(1 for m in training_rounds if m.get("secagg_halted"))
    if halted or min(m["clients_completed"] for m in training_rounds) < num_clients:
        raise RuntimeError(f"{backbone}, {num_clients} clients, {prg}: {halted} rounds halted or clients missing")
    return {
        "clients": num_clients,
        "backbone": backbone,
        "prg": prg,
        "round_s": statistics.median(m["round_seconds"] for m in training_rounds),
        "train_s": statistics.fmean(m["train_seconds"] for m in training_rounds),
        "shares": summary["secure_aggregation"].get("num_shares"),
    }


def update_shapes(backbone: str, args: argparse.Namespace) -> list[tuple[int, ...]]:
    """Shapes of one client's update: the model state it shares."""
    network = build_network(config_for(10, backbone, "none", args, Path(tempfile.gettempdir())))
    return [tuple(t.shape) for t in shared_state(network).values() if torch.is_floating_point(t)]


def time_protocol_round(shapes: list[tuple[int, ...]], num_clients: int, prg: str, share_length: int = 0) -> float:
    """Seconds for one in-process SecAgg+ round of ``num_clients`` clients, all sending the same update (and share)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        setattr(TaskIdentity, name, value)  # the harness builds Flower messages outside a Flower task
    rng = np.random.default_rng(0)
    update = [rng.uniform(-0.1, 0.1, shape).astype(np.float32) for shape in shapes]
    updates = {100 + i: (update, 100) for i in range(num_clients)}  # one array set shared by all: memory
    table = rng.integers(0, 2**32, share_length, dtype=np.int64)
    tables = {node: table for node in updates} if share_length else None
    shares = default_num_shares(num_clients)
    start = time.perf_counter()
    with flowers_prg_here() if prg == "flower" else nullcontext():
        outcome = run_round(updates, shares=shares, threshold=default_threshold(shares), client_shares=tables)
    seconds = time.perf_counter() - start
    if not outcome.completed:
        raise RuntimeError(f"the in-process round with {num_clients} clients and PRG {prg} did not complete")
    return seconds


def time_expansion(prg, size: int, repeats: int = 5) -> float:
    seed = bytes(range(32))
    prg(seed, 2**32, [(size,)])  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        prg(seed, 2**32, [(size,)])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def protocol_tables(args: argparse.Namespace, shapes: dict[str, list[tuple[int, ...]]]) -> None:
    """Tables 1 and 2: one mask expansion, and one in-process SecAgg+ round, under each PRG."""
    print("1. one mask expansion, modulus 2^32 (median of 5)")
    print(f"{'backbone':>9} {'values':>11} {'privfed ms':>10} {'flower ms':>10}")
    for backbone in args.backbones:
        size = sum(math.prod(shape) for shape in shapes[backbone])
        ours, theirs = time_expansion(expand_mask, size) * 1e3, time_expansion(flower_expand, size) * 1e3
        print(f"{backbone:>9} {size:>11,} {ours:>10.1f} {theirs:>10.1f}", flush=True)

    print(f"\n2. the protocol alone: one in-process SecAgg+ round, seconds (median [min-max] of {args.repeats})")
    print(f"{'backbone':>9} {'clients':>7} {'privfed s':>20} {'flower s':>20} {'ratio':>6}")
    for backbone in args.backbones:
        for num_clients in args.clients:
            times: dict[str, list[float]] = {"privfed": [], "flower": []}
            for repeat in range(args.repeats):
                for prg in ("privfed", "flower") if repeat % 2 == 0 else ("flower", "privfed"):
                    times[prg].append(time_protocol_round(shapes[backbone], num_clients, prg))
            ours, theirs = statistics.median(times["privfed"]), statistics.median(times["flower"])
            cells = [f"{statistics.median(t):.2f} [{min(t):.2f}-{max(t):.2f}]" for t in times.values()]
            print(f"{backbone:>9} {num_clients:>7} {cells[0]:>20} {cells[1]:>20} {ours / theirs:>5.3f}x", flush=True)


def share_table(args: argparse.Namespace, shapes: dict[str, list[tuple[int, ...]]]) -> None:
    """Table 3: the protocol round with each client's ``ddp-sums`` table in its masked vector, against without."""
    print(f"\n3. a ddp-sums table in the sum: one in-process SecAgg+ round (privfed PRG), seconds "
          f"(median [min-max] of {args.repeats})")
    print(f"{'backbone':>9} {'clients':>7} {'table':>12} {'without s':>20} {'with s':>20} {'ratio':>6}")
    for backbone in args.backbones:
        for num_clients in args.clients:
            for cells, dim in args.share_tables:
                length = cells * (dim + 1)
                times: dict[int, list[float]] = {0: [], length: []}
                for repeat in range(args.repeats):
                    for size in (0, length) if repeat % 2 == 0 else (length, 0):
                        times[size].append(time_protocol_round(shapes[backbone], num_clients, "privfed", size))
                plain, carried = statistics.median(times[0]), statistics.median(times[length])
                spans = [f"{statistics.median(t):.2f} [{min(t):.2f}-{max(t):.2f}]" for t in times.values()]
                print(f"{backbone:>9} {num_clients:>7} {f'{cells}x{dim + 1}':>12} {spans[0]:>20} {spans[1]:>20} "
                      f"{carried / plain:>5.3f}x", flush=True)


def share_size(text: str) -> tuple[int, int]:
    """``G,D`` -> (G, D)."""
    cells, dim = (int(v) for v in text.split(","))
    return cells, dim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--backbones", nargs="*", default=["resnet8", "resnet18"], help="models of tables 1 and 2 (none: skip them)")
    parser.add_argument("--sim-backbones", nargs="*", default=["resnet8"], help="models of table 3 (none: skip it)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples-per-client", type=int, default=32)
    parser.add_argument("--prgs", nargs="+", choices=PRGS, default=list(PRGS))
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting")
    parser.add_argument("--share-tables", type=share_size, nargs="*", default=[(16, 32), (128, 512)],
                        help="G,D of the ddp-sums tables of table 3 (none: skip it)")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)  # one INFO line per protocol stage otherwise
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the mod runs in Ray's workers

    shapes = {backbone: update_shapes(backbone, args) for backbone in {*args.backbones, *args.sim_backbones}}
    if args.backbones:
        protocol_tables(args, shapes)
    if args.backbones and args.share_tables:
        share_table(args, shapes)
    if not args.sim_backbones:
        return

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backbone in args.sim_backbones:
            for num_clients in args.clients:
                for repeat in range(args.repeats):
                    # Alternate the order, so a drift in machine load does not favour one PRG.
                    for prg in args.prgs if repeat % 2 == 0 else args.prgs[::-1]:
                        out = Path(tmp) / f"{backbone}-k{num_clients}-{prg}-{repeat}"
                        rows.append(run_one(num_clients, backbone, prg, args, out))
                        print(f"  done: {backbone} {num_clients} clients, PRG {prg}, repeat {repeat}: "
                              f"{rows[-1]['round_s']:.2f} s/round", flush=True)
    print(f"\n4. whole Orchestra rounds in simulation: {args.samples_per_client} samples per client, 1 local epoch, "
          f"all clients sampled; per run the median "
          f"of {args.rounds - 1} training rounds, then the median over {args.repeats} runs (min-max in brackets)")
    print(f"{'backbone':>9} {'clients':>7} {'PRG':>8} {'shares':>6} {'round s':>22} {'train s':>8} {'vs flower':>9}")
    cells: dict[tuple[str, int, str], list[dict]] = {}
    for r in rows:
        cells.setdefault((r["backbone"], r["clients"], r["prg"]), []).append(r)
    medians = {key: statistics.median(r["round_s"] for r in runs) for key, runs in cells.items()}
    for (backbone, clients, prg), runs in cells.items():
        times = [r["round_s"] for r in runs]
        base = medians.get((backbone, clients, "flower"))
        ratio = f"{medians[backbone, clients, prg] / base:.3f}x" if base and prg != "none" else "-"
        spread = f"{medians[backbone, clients, prg]:.2f} [{min(times):.2f}-{max(times):.2f}]"
        print(
            f"{backbone:>9} {clients:>7} {prg:>8} {runs[0]['shares'] or '-'!s:>6} {spread:>22} "
            f"{statistics.fmean(r['train_s'] for r in runs):>8.2f} {ratio:>9}"
        )


if __name__ == "__main__":
    main()
