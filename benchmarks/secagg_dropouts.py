"""Dropouts at scale under SecAgg+: rounds complete when the threshold allows, and nothing is lost or charged twice.

Each training round samples ``--sampled`` clients; every sampled client fails
with probability ``--rate`` at a stage drawn uniformly from setup, the key
exchange, masking (after the key exchange), the consistency stage and
unmasking (both after its masked vector was sent)
(``benchmarks/dropout_injection.py``).
Since the failures follow from a seed, the script predicts every round
(who released, whether enough clients survive to unmask) and audits the
finished run against it:

- ``metrics.jsonl``: completed clients and whether the round halted;
- the server's ledger: one release entry per (client, round) whose reply
  reached the server, and no other;
- every client's own ledger (all of them, also of clients the server never
  charged): the same rounds as the server charged it;
- ``summary.json``: halted rounds, rounds run, and the privacy spent equal to
  what the ledger composes.

It prints one line per round and the totals, writes them as JSON with
``--json``, and exits with status 1 if any check fails.

    python benchmarks/secagg_dropouts.py
    python benchmarks/secagg_dropouts.py --rounds 4 --threshold 15 --json /tmp/dropouts.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privfed.config import build_config
from privfed.federation.simulation import simulate
from privfed.privacy.ledger import PrivacyLedger
from privfed.run.directory import RunDirectory
from privfed.run.plan import plan_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for the benchmarks package
from benchmarks.dropout_injection import DropoutPlan, dropout_mod, expected_round


@dataclass
class Audit:
    """What the run did against what the plan predicts; ``problems`` empty means every check held."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def expect(self, holds: bool, problem: str) -> None:
        if not holds:
            self.problems.append(problem)


def audit_round(audit: Audit, record: dict[str, Any], plan: DropoutPlan, threshold: int, charged: set[int]) -> None:
    """Checks one training round's log line and ledger entries against the plan."""
    round_index = record["round"]
    sampled = record["sampled_clients"]
    expected = expected_round(plan, round_index + 1, sampled, threshold)  # Flower round r + 1
    stages = Counter(plan.failing_stage(round_index + 1, c) for c in sampled)
    halted = bool(record.get("secagg_halted"))
    audit.rounds.append({
        "round": round_index,
        "sampled": len(sampled),
        "failed_at": {stage: n for stage, n in stages.items() if stage is not None},
        "released": len(expected.released),
        "survivors": expected.survivors,
        "expected_complete": expected.completes,
        "completed": not halted,
        "clients_completed": record["clients_completed"],
    })
    audit.expect(halted != expected.completes, f"round {round_index}: halted={halted}, predicted complete={expected.completes}")
    audit.expect(
        record["clients_completed"] == len(expected.released),
        f"round {round_index}: {record['clients_completed']} clients completed, {len(expected.released)} replied",
    )
    audit.expect(charged == set(expected.released), f"round {round_index}: ledger charged {sorted(charged)}, "
                 f"replies came from {sorted(expected.released)}")


def audit_run(run_dir: Path, plan: DropoutPlan, threshold: int, summary: dict[str, Any]) -> Audit:
    """Audits a finished run directory (see the module docstring)."""
    audit = Audit()
    run = RunDirectory(run_dir)
    entries = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    releases = [(e["client"], e["round"]) for e in entries if e["kind"] == "release"]
    audit.expect(len(releases) == len(set(releases)), "the server's ledger charges a release twice")
    for record in run.metrics():
        charged = {client for client, round_index in releases if round_index == record["round"]}
        if record["round"] == 0:  # initialisation: plain fit, nobody fails
            audit.expect(charged == set(record["sampled_clients"]), "round 0: not every sampled client was charged")
        else:
            audit_round(audit, record, plan, threshold, charged)
    own_ledgers = {int(path.stem.rsplit("-", 1)[1]): path for path in run.client_ledgers.glob("privfed-ledger-partition-*.jsonl")}
    for client in sorted(set(own_ledgers) | {c for c, _ in releases}):
        own = sorted(json.loads(line)["round"] for line in own_ledgers[client].read_text().splitlines()) if client in own_ledgers else []
        server = sorted(r for c, r in releases if c == client)
        audit.expect(own == server, f"client {client} charged itself rounds {own}, the server {server}")
    halted = sum(not r["completed"] for r in audit.rounds)
    audit.expect(summary["secure_aggregation"]["halted_rounds"] == halted, "summary.json's halted_rounds is off")
    audit.expect(summary["rounds"] == len(audit.rounds), "summary.json's rounds is off")
    ledger = PrivacyLedger.resume(
        run_dir / "ledger.jsonl", mechanism=summary["mechanism"], delta=summary["privacy"]["delta"]
    )
    if ledger.is_dp:
        _, worst = ledger.worst_case()
        audit.expect(abs(summary["privacy"]["epsilon"] - worst) <= 1e-9 * max(1.0, worst),
                     f"summary.json spends epsilon {summary['privacy']['epsilon']}, the ledger composes {worst}")
    return audit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=40, help="clients in the federation")
    parser.add_argument("--sampled", type=int, default=20, help="clients sampled per round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--rate", type=float, default=0.3, help="chance that a sampled client fails in a round")
    parser.add_argument("--threshold", type=int, default=None, help="SecAgg+ reconstruction threshold (default: privfed's)")
    parser.add_argument("--mechanism", default="ldp")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="the run's and the failures' seed")
    parser.add_argument("--out", type=Path, default=None, help="keep the run here")
    parser.add_argument("--json", type=Path, default=None, help="also write the audit as JSON")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="privfed-dropouts-")) / "run"
    config = build_config(
        dataset=f"shapes:{16 * args.clients}", num_clients=args.clients, participation=args.sampled / args.clients,
        alpha=1000.0, projection_dim=16, local_epochs=1, batch_size=16, memory_size=32, num_local_centroids=4,
        num_global_centroids=16, rounds=args.rounds, eval_every=args.rounds, secagg=True,
        secagg_threshold=args.threshold, mechanism=args.mechanism,
        **({"epsilon": args.epsilon} if args.mechanism == "ldp" else {}),
        seed=args.seed, out=str(out), device="cpu",
    )
    plan = DropoutPlan(rate=args.rate, seed=args.seed)
    summary = simulate(plan_run(config), outer_mods=[dropout_mod(plan)])
    settings = summary["secure_aggregation"]
    audit = audit_run(out, plan, settings["reconstruction_threshold"], summary)

    print(f"{args.sampled} of {args.clients} clients per round, failure rate {args.rate}, SecAgg+ "
          f"{settings['num_shares']} shares, threshold {settings['reconstruction_threshold']}, {args.mechanism}")
    print("clients failing at each stage: setup, key exchange, masking (keys shared, no masked vector), unmasking")
    print(f"{'round':>5} {'setup':>5} {'keys':>5} {'masking':>7} {'unmask':>6} {'replied':>7} {'survivors':>9} "
          f"{'predicted':>9} {'observed':>8}")
    for r in audit.rounds:
        failed = r["failed_at"]
        print(f"{r['round']:>5} {failed.get('setup', 0):>5} {failed.get('share_keys', 0):>5} "
              f"{failed.get('collect_masked_vectors', 0):>7} {failed.get('unmask', 0):>6} {r['released']:>7} {r['survivors']:>9} "
              f"{'complete' if r['expected_complete'] else 'halt':>9} {'complete' if r['completed'] else 'halt':>8}")
    completed = sum(r["completed"] for r in audit.rounds)
    failures = sum(sum(r["failed_at"].values()) for r in audit.rounds)
    print(f"rounds completed {completed} of {len(audit.rounds)}; client failures {failures} of "
          f"{sum(r['sampled'] for r in audit.rounds)}; epsilon spent {summary['privacy']['epsilon']}; "
          f"wall {summary['wall_seconds']:.0f}s")
    print("audit: " + ("every check held" if not audit.problems else "; ".join(audit.problems)))
    if args.json is not None:
        args.json.write_text(json.dumps({"rounds": audit.rounds, "problems": audit.problems,
                                         "secure_aggregation": settings, "summary_epsilon": summary["privacy"]["epsilon"]}, indent=2))
    return 1 if audit.problems else 0


if __name__ == "__main__":
    sys.exit(main())
