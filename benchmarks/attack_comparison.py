"""How much each mechanism lets a semi-honest server recover: every attack on the same memories under every mechanism.

Equal footing: for each recorded run and round, the clients' memories are
replayed once (:mod:`attacks.scoring.ground_truth`), and each mechanism
(``reps``, ``kanon``, ``ldp`` at each total epsilon, calibrated as a run of
that budget would be) releases from those same memories, under the same
model snapshot. Training one run per mechanism instead would compare
different models as well as different releases. The members behind every
vector come from the mechanism itself, run here (exact for reps and kanon;
for ldp each row goes to the released centre nearest its leaf's coreset
point). Every attack is fitted before any memory is replayed.

Prints one row per mechanism and attack: the headline PSNR (against the
source for ``reps``, the best member for centroids) mean over runs with its
spread, the null, the advantage, re-identification rate and its chance.

    python benchmarks/attack_comparison.py --runs runs/tradeoff/kanon-seed0 runs/tradeoff/kanon-seed1 --rounds 1 40
    python benchmarks/attack_comparison.py --runs /tmp/run --rounds 1 --steps 50 --max-vectors 20   # smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from attacks import get_attack_class
from attacks.evaluation import (
    DEFAULT_DISTRACTORS,
    ReleaseTruth,
    RoundModel,
    attack_target,
    invert_round,
    load_auxiliary,
    score_round,
    split_auxiliary,
)
from attacks.scoring.ground_truth import replay_round, vector_truths
from mechanisms import create_mechanism, get_mechanism_class
from privfed.data.federated import FederatedSplit
from privfed.errors import PrivfedError
from privfed.privacy.budget import plan_privacy
from privfed.run.directory import RunDirectory
from privfed.run.recording import read_round


def mechanism_settings(epsilons: list[float]) -> list[tuple[str, str, float | None]]:
    """(row name, mechanism, total epsilon) of every row."""
    return [("reps", "reps", None), ("kanon", "kanon", None), *[(f"ldp-eps{e:g}", "ldp", e) for e in epsilons]]


def released_by(mechanism: str, params: dict[str, Any], memories, centroids, num_centroids: int, seed: int):
    """Each replayed memory released by ``mechanism``: ``(vectors, weights)`` per client, and the truth behind them."""
    releases, truth = [], []
    for memory in memories:
        instance = create_mechanism(mechanism, **params)
        if centroids is not None:
            instance.observe_global_centroids(centroids)
        release, members = instance.release_with_members(
            memory.memory, num_centroids=num_centroids, generator=torch.Generator().manual_seed(seed + memory.client)
        )
        releases.append((release.vectors.float(), release.weights.float()))
        truth.append(ReleaseTruth(memory, vector_truths(memory, members, release.num_vectors)))
    return releases, truth


def compare_round(run_dir: Path, round_index: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    run = RunDirectory(run_dir)
    config = run.config()
    device = torch.device(args.device)
    recorded = read_round(run.releases, round_index)
    sizes = FederatedSplit.of(config).client_sizes()
    aux, _ = load_auxiliary(config, None)
    split = split_auxiliary(aux, DEFAULT_DISTRACTORS, torch.Generator().manual_seed(args.seed))
    settings = {} if args.steps is None else {"steps": args.steps}
    # The attacker's part first: every attack fitted on public information only.
    rows_setup, inversions, fit_seconds = [], {}, {}
    for row_name, mechanism, epsilon in mechanism_settings(args.epsilons):
        params = plan_privacy(config.replace(mechanism=mechanism, epsilon=epsilon), sizes).params
        target = attack_target(config, recorded, device, mechanism=mechanism, mechanism_params=params)
        rows_setup.append((row_name, mechanism, params, target))
        for attack_name in args.attacks:
            attack_class = get_attack_class(attack_name)
            key = (attack_name, row_name if attack_class.uses_mechanism else "")
            if key not in inversions:
                start = time.perf_counter()
                inversions[key] = attack_class(seed=args.seed, **settings).fit(target, split.fit)
                fit_seconds[key] = time.perf_counter() - start
    memories = [replay_round(config, recorded, r.client)[0] for r in recorded.releases]
    rows = []
    for row_name, mechanism, params, target in rows_setup:
        releases, truth = released_by(mechanism, params, memories, recorded.centroids, config.num_local_centroids, args.seed)
        single_source = get_mechanism_class(mechanism).releases_raw_data
        for attack_name in args.attacks:
            key = (attack_name, row_name if get_attack_class(attack_name).uses_mechanism else "")
            start = time.perf_counter()
            try:
                inverted = invert_round(
                    [RoundModel(target, inversions[key])] * len(releases), releases, null_images=split.null, max_vectors=args.max_vectors,
                    generator=torch.Generator().manual_seed(args.seed),
                )
                summary, _ = score_round(inverted, truth, distractors=split.distractors, single_source=single_source)
            except PrivfedError as err:  # e.g. ldp at a small epsilon: every vector is padding
                summary = {"error": str(err)}
            rows.append({
                "run": str(run_dir), "seed": config.seed, "round": round_index, "mechanism": row_name,
                "attack": attack_name, "fit_seconds": fit_seconds[key], "seconds": time.perf_counter() - start,
                "headline": "psnr_source" if single_source else "psnr_best_member", **summary,
            })
            print(f"  {run_dir.name} round {round_index} {row_name:<10} {attack_name:<17} {_headline(rows[-1])}", flush=True)
    return rows


def _headline(row: dict[str, Any]) -> str:
    if "error" in row:
        return row["error"]
    score = row["headline"]
    return (
        f"{score} {row[score]:.2f} (null {row['null_' + score]:.2f}, adv {row['advantage_' + score]:+.2f}) "
        f"reid {row['reid_rate']:.3f} (chance {row['reid_chance']:.3f})"
    )


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Mechanism x attack x round, averaged over runs (seeds): mean ± std over runs of each run's mean."""
    lines = [
        f"{'mechanism':<10} {'attack':<17} {'round':>5} {'runs':>4}  {'score':<16} {'PSNR':>14} {'null':>6} "
        f"{'advantage':>15} {'adv 95% CI (run 1)':>18} {'SSIM':>6} {'reid':>6} {'null':>6} {'chance':>7}"
    ]
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["mechanism"], row["attack"], row["round"]), []).append(row)
    for (mechanism, attack, round_index), group in groups.items():
        ok = [r for r in group if "error" not in r]
        if not ok:
            lines.append(f"{mechanism:<10} {attack:<17} {round_index:>5} {len(group):>4}  {group[0]['error']}")
            continue
        score = ok[0]["headline"]
        ssim = score.replace("psnr", "ssim")

        def spread(key: str) -> str:
            values = [r[key] for r in ok]  # noqa: B023 (called only within this iteration)
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            return f"{statistics.fmean(values):.2f}±{std:.2f}"

        ci = ok[0].get(f"advantage_{score}_ci95")
        ci_text = "-" if ci is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"
        lines.append(
            f"{mechanism:<10} {attack:<17} {round_index:>5} {len(ok):>4}  {score:<16} {spread(score):>14} "
            f"{statistics.fmean(r['null_' + score] for r in ok):>6.2f} {spread('advantage_' + score):>15} {ci_text:>18} "
            f"{statistics.fmean(r[ssim] for r in ok):>6.3f} {statistics.fmean(r['reid_rate'] for r in ok):>6.3f} "
            f"{statistics.fmean(r['null_reid_rate'] for r in ok):>6.3f} {statistics.fmean(r['reid_chance'] for r in ok):>7.4f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="runs trained with --record-releases (one per seed)")
    parser.add_argument("--rounds", type=int, nargs="+", required=True)
    parser.add_argument("--attacks", nargs="+", default=["decoder", "decoder-releases", "optimization"])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--max-vectors", type=int, default=100)
    parser.add_argument("--steps", type=int, default=None, help="override every attack's step budget")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for run_dir in args.runs:
        for round_index in args.rounds:
            rows += compare_round(run_dir, round_index, args)
            if args.json is not None:
                args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
