"""What the attacks cost: decoder training, per-vector inversion, and recording as a fraction of training time.

Takes a run trained with ``--record-releases`` and prints:

- the time one round's recording takes (writing ``releases/round-XXXX.pt``,
  median of repeats) against the run's mean round time, as a fraction;
- the mechanism-aware and plain decoders' training time at their default
  budgets (or ``--steps``), and the time to decode one vector;
- the optimisation attack's time per vector at its default budget;
- the score floors: the auxiliary mean image, and a random other image,
  against the run's training images (what "no information" scores).

    python benchmarks/attack_cost.py runs/kanon-seed0 --round 40
    python benchmarks/attack_cost.py /tmp/run --round 1 --steps 50 --vectors 4   # smoke test
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from attacks import get_attack_class
from attacks.evaluation import attack_target, load_auxiliary
from attacks.scoring.ground_truth import training_images
from attacks.scoring.image_scores import psnr, ssim
from privfed.data.augment import to_float
from privfed.run.directory import RunDirectory
from privfed.run.recording import read_round, write_round


def recording_seconds(recorded, repeats: int = 5) -> float:
    """Median time to write one round's file."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            start = time.perf_counter()
            write_round(Path(tmp), recorded)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def print_floors(aux: torch.Tensor, private: torch.Tensor, count: int = 1000) -> None:
    """PSNR/SSIM of the auxiliary mean image, and of a random auxiliary image, against random private images."""
    g = torch.Generator().manual_seed(0)
    truth = to_float(private[torch.randint(private.shape[0], (count,), generator=g)])
    mean = to_float(aux).mean(dim=0, keepdim=True).expand_as(truth)
    other = to_float(aux[torch.randint(aux.shape[0], (count,), generator=g)])
    for name, guess in (("auxiliary mean image", mean), ("random auxiliary image", other)):
        print(f"floor, {name}: PSNR {float(psnr(guess, truth).mean()):.2f} dB, SSIM {float(ssim(guess, truth).mean()):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--round", type=int, required=True)
    parser.add_argument("--steps", type=int, default=None, help="override the attacks' step budgets")
    parser.add_argument("--vectors", type=int, default=16, help="vectors the optimisation attack inverts")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    run = RunDirectory(args.run_dir)
    config = run.config()
    recorded = read_round(run.releases, args.round)
    rounds = [m["round_seconds"] for m in run.metrics() if m.get("round") and m.get("round_seconds")]
    write = recording_seconds(recorded)
    size = (run.releases / f"round-{args.round:04d}.pt").stat().st_size
    print(f"recording: {write * 1e3:.1f} ms and {size / 1e6:.2f} MB per round; mean round {statistics.fmean(rounds):.1f} s "
          f"-> {write / statistics.fmean(rounds):.2%} of training time")
    device = torch.device(args.device)
    target = attack_target(config, recorded, device)
    aux, _ = load_auxiliary(config, None)
    print_floors(aux, training_images(config))
    vectors = torch.cat([r.vectors for r in recorded.releases]).float()
    settings = {} if args.steps is None else {"steps": args.steps}
    for name in ("decoder", "decoder-releases"):
        attack = get_attack_class(name)(seed=0, **settings)
        start = time.perf_counter()
        inversion = attack.fit(target, aux)
        fit = time.perf_counter() - start
        start = time.perf_counter()
        inversion(vectors)
        per_vector = (time.perf_counter() - start) / vectors.shape[0]
        print(f"{name}: training {fit:.1f} s ({attack.settings()['steps']} steps); {per_vector * 1e3:.3f} ms per vector")
    attack = get_attack_class("optimization")(seed=0, **settings)
    inversion = attack.fit(target, aux)
    chosen = vectors[: args.vectors]
    start = time.perf_counter()
    inversion(chosen)
    per_vector = (time.perf_counter() - start) / chosen.shape[0]
    print(f"optimization: {per_vector:.2f} s per vector ({attack.settings()['steps']} steps x {attack.restarts} restarts, "
          f"{chosen.shape[0]} vectors at once) on {device}")


if __name__ == "__main__":
    main()
