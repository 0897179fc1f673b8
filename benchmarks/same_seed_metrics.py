"""Same seed, same metrics: one fingerprint per short run, to compare a checkout before and after a refactor.

Each run is ``privfed train`` with tiny settings (seconds each): every
mechanism under orchestra, every method with its default mechanism (or none),
and DP-SGD. One JSON line per run: the last ``metrics.jsonl`` line's values
(timings dropped), the summary's kNN figures and privacy headline and epsilon
figures, the ledgers' entry counts and a digest of the final encoder.

The DP noise (ldp, ldp-sums, ddp-sums, DP-SGD) comes from the OS CSPRNG by
design, so no two runs share it. For this comparison only, each run's child
process replaces that randomness with seeded streams before privfed is
imported (``secrets.SystemRandom``/``random.SystemRandom``: one shared stream;
``secrets.randbits``/``randbelow``/``choice``: another). The package is not
changed. Clients train in that process one after another (``--client-cpus
2``), so the streams are read in one order; forked workers would not be.
DP-SGD still trains another model each time (the seeds it draws are
replaced, something else is not: not found yet), so its lines keep only
what repeats (see :func:`comparable`).

    python benchmarks/same_seed_metrics.py > after.jsonl
    python benchmarks/same_seed_metrics.py --compare before.jsonl   # exit 1 when a line differs

Run it against another checkout with ``PYTHONPATH=<checkout>`` (each run
imports privfed from there).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: Shared by every run: tiny, CPU, clients in-process one after another.
BASE = [
    "--dataset", "shapes:200", "-K", "4", "-R", "1.0", "--projection-dim", "16", "-E", "1", "--batch-size", "16",
    "--memory-size", "32", "-L", "4", "-G", "8", "--rounds", "2", "--backbone", "resnet8", "--device", "cpu",
    "--client-cpus", "2", "--eval-every", "2", "--checkpoint-every", "0",
]
DP = ["--epsilon", "5"]

#: name -> the flags after BASE.
RUNS: dict[str, list[str]] = {
    "mechanism-kanon": ["--mechanism", "kanon"],
    "mechanism-ldp": ["--mechanism", "ldp", *DP],
    "mechanism-ldp-sums": ["--mechanism", "ldp-sums", *DP],
    "mechanism-ldp-sums-no-secret-sample": ["--mechanism", "ldp-sums", *DP, "--no-secret-sample"],
    "mechanism-ddp-sums": ["--mechanism", "ddp-sums", *DP],
    "mechanism-reps": ["--mechanism", "reps"],
    **{
        f"method-{method}": ["--method", method]
        for method in (
            "orchestra-no-rotation", "orchestra-no-target", "orchestra-fixed-centroids",
            "simclr", "simsiam", "byol", "specloss", "supervised", "rotpred",
        )
    },
    "dp-sgd-orchestra-ldp": ["--mechanism", "ldp", *DP, "--dp-sgd"],
    "dp-sgd-rotpred": ["--method", "rotpred", "--dp-sgd"],
}

#: Summary fields kept besides ``privacy``'s figures.
SUMMARY_FIELDS = ("knn_accuracy", "knn_accuracy_init", "rounds", "final_loss", "stopped_early")


def is_timing(key: str) -> bool:
    return key.endswith("_seconds") or key == "seconds" or "elapsed" in key or key.endswith("_time")


def is_figure(value: Any) -> bool:
    """A number, None, or a non-empty list of them (the fields a fingerprint keeps)."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return True
    return isinstance(value, list) and bool(value) and all(is_figure(v) and not isinstance(v, list) for v in value)


def figures(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``record``'s numeric fields (nested dicts flattened as ``a.b``), timings dropped, NaN as a string."""
    kept: dict[str, Any] = {}
    for key, value in record.items():
        if is_timing(key):
            continue
        if isinstance(value, dict):
            kept.update(figures(value, f"{prefix}{key}."))
        elif is_figure(value):
            kept[prefix + key] = "nan" if isinstance(value, float) and math.isnan(value) else value
    return kept


def count_lines(path: Path) -> int | None:
    return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.is_file() else None


def encoder_digest(run_dir: Path) -> str | None:
    """SHA-256 of the final encoder's tensors, by name; None when the API cannot load it."""
    try:
        import privfed

        state = privfed.load_encoder(run_dir).state_dict()
    except Exception as err:  # a missing API is reported, not fatal
        return f"unavailable: {type(err).__name__}"
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def fingerprint(run_dir: Path) -> dict[str, Any]:
    """What a run left behind that a refactor must not change."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "summary.json").read_text())
    privacy = summary.get("privacy") or {}
    client_ledgers = sorted((run_dir / "client-ledgers").glob("*ledger*.jsonl"))
    return {
        "metrics_lines": len(lines),
        "metrics": figures(lines[-1]) if lines else None,
        "summary": {key: summary.get(key) for key in SUMMARY_FIELDS},
        "privacy_headline": privacy.get("headline"),
        "privacy": figures(privacy),
        "ledger_entries": count_lines(run_dir / "ledger.jsonl"),
        "client_ledger_entries": sum(count_lines(p) or 0 for p in client_ledgers) if client_ledgers else None,
        "encoder_sha256": encoder_digest(run_dir),
    }


#: DP-SGD runs: a repeat with every seed above fixed still trains another model (4 tries, 4 kNN accuracies), so
#: only these fields are compared: the plan, the privacy figures, the ledgers, the untrained kNN.
DP_SGD_KEPT_METRICS = ("round", "clients_sampled", "sampled_clients", "clients_completed", "client_failures",
                       "rejected_replies")


def comparable(printed: dict[str, Any]) -> dict[str, Any]:
    """``printed`` less what does not repeat: a DP-SGD run's training results."""
    if not printed.get("run", "").startswith("dp-sgd") or printed.get("exit_code") != 0:
        return printed
    kept = {k: v for k, v in printed.items() if k != "encoder_sha256"}
    kept["metrics"] = {k: v for k, v in (printed.get("metrics") or {}).items()
                       if k in DP_SGD_KEPT_METRICS or k.startswith("privacy_")}
    kept["summary"] = {k: v for k, v in (printed.get("summary") or {}).items() if k not in ("knn_accuracy", "final_loss")}
    kept["unrepeated"] = "training results (kNN, encoder, release counts): DP-SGD draws from a source not seeded here"
    return kept


def seed_os_randomness(seed: str) -> None:
    """Replaces the CSPRNG draws Python code makes with seeded streams, in this process only (before privfed loads)."""
    import random
    import secrets

    shared = random.Random(f"{seed}:SystemRandom")  # every "SystemRandom()" reads this one stream
    bits = random.Random(f"{seed}:randbits")

    def system_random(*_args: Any, **_kwargs: Any) -> random.Random:
        return shared

    secrets.SystemRandom = system_random  # type: ignore[assignment,misc]
    random.SystemRandom = system_random  # type: ignore[assignment,misc]
    secrets.randbits = bits.getrandbits
    secrets.randbelow = lambda n: bits.randrange(n)
    secrets.choice = bits.choice


def patch_secure_source() -> None:
    """Where a noise module names its source, make it the seeded one too (a no-op when it is gone or moved)."""
    import importlib
    import random

    for name in ("mechanisms.noise",):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "secure_source"):
            module.secure_source = lambda: random.SystemRandom()  # the patched, seeded one


def child(name: str, run_dir: Path, result: Path) -> None:
    """One run in this process, seeded, then its fingerprint written to ``result``."""
    seed_os_randomness(f"same-seed:{name}")
    patch_secure_source()
    from privfed.cli import main

    argv = ["train", *BASE, "--seed", "1", *RUNS[name], "--out", str(run_dir)]
    try:
        main(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    printed: dict[str, Any] = {"run": name, "exit_code": code}
    if code == 0:
        printed.update(fingerprint(run_dir))
    result.write_text(json.dumps(printed, sort_keys=True))


def child_environment() -> dict[str, str]:
    """This environment; PYTHONPATH, when unset, this checkout (so the runs import its privfed, not the installed one).

    A fixed hash seed: a set's order must not differ between two runs.
    """
    return {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH") or str(REPO),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONHASHSEED": "0"}


def run_one(name: str, folder: Path) -> tuple[dict[str, Any], float, str]:
    """``name`` in a child process; its fingerprint, wall seconds and output."""
    result = folder / f"{name}.json"
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--child", name, str(folder / name), str(result)],
        capture_output=True, text=True, env=child_environment(),
    )
    seconds = time.perf_counter() - started
    output = done.stdout + done.stderr
    if not result.is_file():
        return {"run": name, "exit_code": done.returncode, "error": output.strip().splitlines()[-1:]}, seconds, output
    return json.loads(result.read_text()), seconds, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(RUNS), help="these runs only (default: all)")
    parser.add_argument("--compare", type=Path, help="a saved output: exit 1 when a run's line differs from it")
    parser.add_argument("--list", action="store_true", help="print the runs' flags and exit")
    parser.add_argument("--child", nargs=3, metavar=("RUN", "RUN_DIR", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return
    names = args.only or list(RUNS)
    if args.list:
        for name in names:
            print(name, "privfed train", *BASE, "--seed 1", *RUNS[name])
        return
    expected = {}
    if args.compare:
        expected = {line["run"]: comparable(line) for line in map(json.loads, args.compare.read_text().splitlines()) if line}
    where = subprocess.run([sys.executable, "-c", "import privfed; print(privfed.__file__)"],
                           capture_output=True, text=True, env=child_environment(), cwd="/").stdout.strip()
    print(f"# privfed from {where}", file=sys.stderr)
    differ, total = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="same-seed-") as folder:
        for name in names:
            printed, seconds, output = run_one(name, Path(folder))
            printed = comparable(printed)
            print(json.dumps(printed, sort_keys=True), flush=True)
            print(f"# {name}: {seconds:.1f} s, exit {printed['exit_code']}", file=sys.stderr, flush=True)
            if printed["exit_code"] != 0:
                print(output[-3000:], file=sys.stderr)
            if args.compare and expected.get(name) != printed:
                differ.append(name)
                keys = sorted(k for k in {*printed, *expected.get(name, {})} if printed.get(k) != expected.get(name, {}).get(k))
                print(f"# DIFFERS from {args.compare}: {name}: {', '.join(keys)}", file=sys.stderr)
    print(f"# {len(names)} runs in {time.perf_counter() - total:.0f} s", file=sys.stderr)
    if args.compare:
        print(f"# {len(names) - len(differ)}/{len(names)} match {args.compare}", file=sys.stderr)
        if differ:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
