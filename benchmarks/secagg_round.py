"""Wall time of an Orchestra round with and without SecAgg+, for several round sizes.

Every client is sampled in every round, holds the same small amount of data
and trains the small backbone for one local epoch, so the difference between
the two columns is the protocol's cost (key exchange, masking, unmasking).
A round is timed from client sampling to the aggregate being applied (the
kNN evaluation is not included); the figure is the median over the
training rounds, round 0 (initialisation, never secure) left out.

    python benchmarks/secagg_round.py
    python benchmarks/secagg_round.py --clients 10 50 --rounds 3 --samples-per-client 32
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from privfed.config import build_config
from privfed.federation.simulation import simulate
from privfed.runs import RunDirectory
from privfed.run_plan import plan_run


def run_one(num_clients: int, secagg: bool, args: argparse.Namespace, out: Path) -> dict:
    config = build_config(
        dataset=f"shapes:{num_clients * args.samples_per_client}",
        num_clients=num_clients,
        participation=1.0,
        alpha=1000.0,  # near-equal client sizes
        backbone=args.backbone,
        projection_dim=16,
        rounds=args.rounds,
        local_epochs=1,
        batch_size=16,
        memory_size=32,
        num_local_centroids=4,
        num_global_centroids=16,
        eval_every=args.rounds,
        secagg=secagg,
        report_client_metrics=True,  # the client train time column; 16 more values in the masked sum
        out=str(out),
        device="cpu",
    )
    summary = simulate(plan_run(config))
    training_rounds = [m for m in RunDirectory(out).metrics() if m["round"] > 0]
    return {
        "clients": num_clients,
        "secagg": secagg,
        "round_s": statistics.median(m["round_seconds"] for m in training_rounds),
        "train_s": statistics.fmean(m["train_seconds"] for m in training_rounds),
        "completed": min(m["clients_completed"] for m in training_rounds),
        "shares": summary["secure_aggregation"].get("num_shares"),
        "threshold": summary["secure_aggregation"].get("reconstruction_threshold"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples-per-client", type=int, default=32)
    parser.add_argument("--backbone", default="resnet8")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for num_clients in args.clients:
            for secagg in (False, True):
                rows.append(run_one(num_clients, secagg, args, Path(tmp) / f"k{num_clients}-{secagg}"))
    print(f"{args.backbone}, {args.samples_per_client} samples per client, 1 local epoch, all clients sampled")
    print(f"{'clients':>7} {'secagg':>6} {'shares/threshold':>16} {'round s (median)':>16} {'client train s':>14} {'overhead':>8}")
    plain = {r["clients"]: r["round_s"] for r in rows if not r["secagg"]}
    for r in rows:
        protocol = f"{r['shares']}/{r['threshold']}" if r["secagg"] else "-"
        overhead = f"{r['round_s'] / plain[r['clients']]:.2f}x" if r["secagg"] else "-"
        print(
            f"{r['clients']:>7} {str(r['secagg']):>6} {protocol:>16} {r['round_s']:>16.2f} "
            f"{r['train_s']:>14.2f} {overhead:>8}"
        )


if __name__ == "__main__":
    main()
