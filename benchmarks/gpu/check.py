"""The GPU check's parts, each under its own time budget, gathered into one JSON (issues 32 and 43).

Parts (``GPU_CHECK_PARTS``): ``env`` (card, torch, nvidia-smi, that privfed's imports
resolve), ``step`` (:mod:`benchmarks.gpu.step_throughput`: one client's step),
``cohort`` (:mod:`benchmarks.gpu.cohort_step`: clients trained together as one
batched step against one after another, and aten ops per step), ``train`` (a short
run of the paper's cross-device preset on the dev images with clients batched, each
round split into training, SecAgg+, kNN and the rest by :mod:`benchmarks.gpu.round_split`,
and projected to the paper's run) and ``presets`` (the ``gpu-cifar10-dev`` preset per
method, Orchestra and RotPred first, each run's rounds fitted to the budget as it
goes, then a linear probe of each encoder and of the untrained one). Each part runs
as subprocesses: one that fails or runs out of time records why, and the rest still
run. The JSON is rewritten after every part, so a killed check still leaves what it
measured. ``benchmarks/gpu/check.sh`` installs the wheels and calls this; sizes come
from ``GPU_CHECK_*`` variables (:func:`settings`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PAPER = {"rounds": 100, "local_epochs": 10, "clients_per_round": 50, "images_per_client": 500, "eval_every": 10}
CIFAR10_TRAIN, CIFAR10_TEST = 50_000, 10_000
IMPORTS = "import privfed.cli, flwr, opacus, dp_accounting, cryptography, privfed.federation.server_app, privfed.federation.client_app"
PARTS = ("env", "step", "cohort", "train", "presets")
#: A preset run's round means kept in the JSON (the clustering's health: DESIGN.md §4).
CURVE_VALUES = ("loss", "cluster_loss", "rotation_loss", "target_entropy", "centroid_cosine", "train_seconds")


@dataclass(frozen=True)
class Settings:
    """Everything the check's size depends on; :func:`settings` reads them from the environment."""

    parts: str  # which parts run, in this order
    device: str
    dataset: str
    clients: int  # the train part's clients (half train per round)
    rounds: int
    runtime_args: str  # "--runtime local" (batched clients need it); "" runs the default runtime
    train_args: str  # extra `privfed train` flags of the train part (the toy size shrinks the model here)
    batches: str
    steps: int
    warmup: int
    backbone: str
    cohort_args: str  # cohort_step.py's sizes (device and backbone come from the fields above)
    preset: str
    preset_args: str  # extra `privfed train` flags of every preset run
    methods: str  # the preset's methods in order: the first two always run, later ones if time is left
    evaluate_s: float  # seconds kept for each linear probe
    finish_s: float  # seconds a run takes after its last round (final checkpoint, summary, curves)
    grace_s: float  # seconds a run past its budget has to finish its round after SIGINT
    budgets: dict[str, float]  # seconds planned per part; time a part leaves over goes to the next


def settings(env: dict[str, str] | os._Environ[str] = os.environ) -> Settings:
    """The GPU sizes, or the toy CPU sizes under ``GPU_CHECK_TOY=1``; any ``GPU_CHECK_<FIELD>`` overrides one."""
    toy = env.get("GPU_CHECK_TOY") == "1"
    small_model = "--backbone resnet8 --projection-dim 32 --num-global-centroids 8 --participation 1"
    base = Settings(
        parts=" ".join(PARTS),
        device="cpu" if toy else "cuda",
        dataset="shapes:96" if toy else f"arrays:{REPO / '.gpu-wheelhouse/data/cifar10-dev.npz'}",
        # 16 clients a round: SecAgg+ costs ~2.5 s of CPU a client (docs/performance.md); 50 would take the budget.
        clients=3 if toy else 32,
        rounds=1,
        runtime_args="--runtime local",
        train_args=f"{small_model} --client-gpus 0 --clients-per-step 3" if toy else "--participation 0.5 --clients-per-step 0",
        batches="4" if toy else "16 256",
        steps=1 if toy else 10,
        warmup=1 if toy else 3,
        backbone="resnet8" if toy else "resnet18",
        cohort_args=(
            "--clients 2 --images 8 --batch 4 --epochs 1 --repeats 1 --per-client-clients 1 --ops-clients 2" if toy
            else "--clients 1 8 16 50 --images 64 --batch 16 --epochs 2 --repeats 2 --per-client-clients 4 --ops-clients 8"
        ),
        preset="gpu-cifar10-dev",
        preset_args=f"{small_model} --num-clients 3 --local-epochs 1 --rounds 2 --eval-every 1 --clients-per-step 3" if toy else "",
        methods="orchestra rotpred" if toy else "orchestra rotpred byol simclr",
        evaluate_s=30.0 if toy else 25.0,
        finish_s=15.0 if toy else 8.0,
        grace_s=45.0 if toy else 30.0,
        # check.sh gives check.py 540 s (900 at the toy size) less the install and 15 s; the presets part also
        # gets what the others leave.
        budgets=(
            {"env": 30, "step": 45, "cohort": 60, "train": 150, "presets": 300} if toy
            else {"env": 15, "step": 30, "cohort": 45, "train": 110, "presets": 300}
        ),
    )
    values = asdict(base)
    for name, value in values.items():
        given = env.get(f"GPU_CHECK_{name.upper()}")
        if given is not None and name != "budgets":
            values[name] = type(value)(given)
    for part in values["budgets"]:
        given = env.get(f"GPU_CHECK_BUDGET_{part.upper()}")
        if given is not None:
            values["budgets"][part] = float(given)
    unknown = set(values["parts"].split()) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown part(s) {sorted(unknown)}: the parts are {' '.join(PARTS)}")
    return Settings(**values)


def run_command(
    args: list[str], *, budget: float, log: Path, grace: float = 30.0, append: bool = False,
    watch: Callable[[float], bool] | None = None,
) -> dict[str, Any]:
    """Runs ``args`` with its output in ``log``; past ``budget`` it gets SIGINT (privfed stops cleanly), then SIGKILL.

    ``watch``, asked every half second with the seconds so far, may ask for the SIGINT
    earlier: a privfed run then stops after the round it is in.
    """
    start = time.perf_counter()
    with open(log, "a" if append else "w") as out:
        out.write(f"$ {shlex.join(args)}\n")
        out.flush()
        process = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        asked, timed_out = False, False
        try:
            while (code := process.poll()) is None:
                elapsed = time.perf_counter() - start
                if elapsed >= max(budget, 1.0):  # a second SIGINT would stop a privfed run at once: none if asked
                    timed_out = True
                    code = _interrupt(process, grace, signal_first=not asked)
                    break
                if watch is not None and not asked and watch(elapsed):
                    asked = True
                    os.killpg(process.pid, signal.SIGINT)
                time.sleep(0.5 if watch is not None else 0.1)
        finally:  # the check itself interrupted: its own session would outlive the device command
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    return {"command": shlex.join(args), "returncode": code, "timed_out": timed_out, "stop_asked": asked,
            "seconds": time.perf_counter() - start, "log_tail": _tail(log)}


def _interrupt(process: subprocess.Popen[bytes], grace: float, *, signal_first: bool = True) -> int:
    if signal_first:
        os.killpg(process.pid, signal.SIGINT)
    try:
        return process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def _tail(log: Path, lines: int = 15) -> list[str]:
    return log.read_text(errors="replace").splitlines()[-lines:]


class GpuSampler:
    """Samples the GPU's utilisation and memory with ``nvidia-smi -lms`` while a part runs (nothing without it)."""

    def __init__(self, path: Path, every_ms: int = 500) -> None:
        self.path, self.process = path, None
        command = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                   f"--loop-ms={every_ms}"]
        with open(path, "w") as out:  # the child keeps its own copy of the descriptor
            try:
                self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL)
            except OSError:
                self.process = None

    def stop(self) -> dict[str, Any] | None:
        if self.process is None:
            return None
        self.process.terminate()
        self.process.wait()
        rows = [row for row in map(_numbers, self.path.read_text().splitlines()) if len(row) == 2]
        if not rows:
            return None
        util, memory = zip(*rows)
        return {"samples": len(rows), "util_mean_pct": statistics.fmean(util), "util_max_pct": max(util),
                "memory_used_max_mib": max(memory)}


def _numbers(line: str) -> list[float]:
    """The numbers of one nvidia-smi CSV line (none from a line cut short or saying "[N/A]")."""
    try:
        return [float(v) for v in line.split(",")]
    except ValueError:
        return []


def client_steps(images: int, batch: int) -> int:
    """Steps one epoch takes on ``images`` (a trailing batch of one is dropped, as local training does)."""
    steps = math.ceil(images / batch)
    return steps - 1 if images % batch == 1 else steps


def samples_per_epoch(images: int, batch: int) -> int:
    """Images one epoch trains on (a trailing batch of one is dropped)."""
    return images - 1 if images % batch == 1 else images


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (none if it is missing); a last line cut short by a kill is left out."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def round_split(run_dir: Path, split: Path) -> dict[str, Any]:
    """A run's rounds: wall time (``metrics.jsonl``) split into training, SecAgg+, kNN and the rest (``split``).

    A round's wall time is the growth of ``elapsed_seconds`` (the round and what the
    driver does after it), or, where timed, the span the timers cover, from one round's
    end to the next. ``split`` is :mod:`benchmarks.gpu.round_split`'s output; the
    rest is the wall time less the three timed kinds (model copies, stored replies,
    releases, global clustering, messages, checkpoints); ``rest_timed`` says how much of
    it the clients' fits and the server's aggregation took outside those kinds.
    """
    from privfed.config import load_saved_config
    from privfed.data.federated import FederatedSplit

    config = load_saved_config(run_dir / "config.json")
    sizes = FederatedSplit.of(config).client_sizes()
    lines = read_jsonl(split)
    timed = {line["round"]: line for line in lines if line.get("event") == "round"}
    rows, previous = [], 0.0
    for record in read_jsonl(run_dir / "metrics.jsonl"):
        row: dict[str, Any] = {"round": record["round"], "wall_s": record["elapsed_seconds"] - previous,
                               "clients": record["clients_completed"], "knn": record.get("knn_accuracy")}
        previous = record["elapsed_seconds"]
        if record["round"] > 0:
            row["samples"] = config.local_epochs * sum(samples_per_epoch(sizes[c], config.batch_size) for c in record["sampled_clients"])
        if record["round"] in timed:  # the timers' own span: the driver's work after its clock was read included
            line = timed[record["round"]]
            seconds, calls = line["seconds"], line["calls"]
            row["wall_s"] = line.get("wall_s", row["wall_s"])
            row.update({f"{kind}_s": seconds.get(kind, 0.0) for kind in ("train", "secagg", "knn")})
            row["rest_s"] = row["wall_s"] - row["train_s"] - row["secagg_s"] - row["knn_s"]
            row["rest_timed"] = {f"{kind}_s": seconds.get(kind, 0.0) for kind in ("client", "server")}  # inside rest_s
            row["train_calls"] = {name: calls[name] for name in ("train_cohort", "train_locally") if calls.get(name)}
        rows.append(row)
    header = next((line for line in lines if line.get("event") == "timers"), {})
    return {"rounds": rows, "timers_missing": header.get("missing"), "images_per_client_here": statistics.fmean(sizes),
            "images_here": _dataset_images(config), "batch_size": config.batch_size}


def paper_projection(
    rounds: list[dict[str, Any]], *, images_here: int, batched_samples_per_s: float | None = None,
) -> dict[str, Any]:
    """The paper run's wall time from the medians of the measured training rounds.

    The paper's round trains 50 clients × 10 epochs × 500 images. Training takes
    those sample-steps at ``batched_samples_per_s`` (the cohort part's rate, clients
    batched) when given, else at this run's own rate. SecAgg+ and the rest are taken
    per client and times 50 (the rest also holds per-round work, so this errs high).
    A kNN evaluation costs what it cost here, times CIFAR-10's images over the images
    here; round 0 is its measured time less kNN, per client, times 50.
    """
    trained = [r for r in rounds if r["round"] > 0 and "train_s" in r and r["clients"]]
    if not trained:
        raise ValueError("no training round was timed")
    clients = PAPER["clients_per_round"]
    per_client = lambda key: statistics.median(r[key] / r["clients"] for r in trained)  # noqa: E731
    samples = clients * PAPER["local_epochs"] * PAPER["images_per_client"]
    as_run = samples * statistics.median(r["train_s"] / r["samples"] for r in trained if r.get("samples"))
    train_s = samples / batched_samples_per_s if batched_samples_per_s else as_run
    secagg_s, rest_s = clients * per_client("secagg_s"), clients * per_client("rest_s")
    knn_runs = [r["knn_s"] for r in rounds if r.get("knn_s")]
    knn_s = statistics.median(knn_runs) * (CIFAR10_TRAIN + CIFAR10_TEST) / images_here if knn_runs else 0.0
    zero = next((r for r in rounds if r["round"] == 0 and r["clients"]), None)
    round0_s = 0.0 if zero is None else (zero["wall_s"] - zero.get("knn_s", 0.0)) * clients / zero["clients"] + knn_s
    round_s = train_s + secagg_s + rest_s
    evaluations = PAPER["rounds"] / PAPER["eval_every"]
    total = round0_s + PAPER["rounds"] * round_s + knn_s * evaluations
    return {
        "training_from": "cohort part" if batched_samples_per_s else "this run", "train_s_per_round": train_s,
        "train_s_per_round_as_run": as_run, "secagg_s_per_round": secagg_s, "rest_s_per_round": rest_s,
        "round_s": round_s, "knn_eval_s": knn_s, "round0_s": round0_s, "run_hours": total / 3600,
        "shares": {"training": PAPER["rounds"] * train_s / total, "secagg": PAPER["rounds"] * secagg_s / total,
                   "rest": (PAPER["rounds"] * rest_s + round0_s + knn_s * evaluations) / total},
        "how": "round 0 + 100 x (250,000 sample-steps at the batched rate + 50 x SecAgg+ and rest per client) "
               "+ 10 kNN evaluations scaled by CIFAR-10's image count",
    }


def _dataset_images(config: Any) -> int:
    from privfed.data.federated import cached_dataset

    return sum(len(cached_dataset(config.dataset, s, config.data_dir, False)) for s in ("train", "test"))


def stop_after_this_round(ends: list[float], *, budget: float, finish: float) -> bool:
    """Whether a run should stop after the round it is in: the one after it would not end, with the run's finish, in ``budget``.

    ``ends``: seconds into the run at which each round logged so far ended (round 0
    first). A round is taken to last the mean time between those ends, or, before a
    second round has ended, as long as the run took to end round 0.
    """
    if not ends:
        return False
    gaps = [later - earlier for earlier, later in itertools.pairwise(ends)]
    per_round = statistics.fmean(gaps) if gaps else ends[0]
    return ends[-1] + 2 * per_round + finish > budget


class RoundWatch:
    """Follows a run's ``metrics.jsonl`` and says when to stop it (:func:`stop_after_this_round`)."""

    def __init__(self, metrics: Path, *, budget: float, finish: float) -> None:
        self.metrics, self.budget, self.finish = metrics, budget, finish
        self.ends: list[float] = []

    def __call__(self, elapsed: float) -> bool:
        logged = self.metrics.read_text().count("\n") if self.metrics.is_file() else 0  # whole lines only
        self.ends += [elapsed] * (logged - len(self.ends))
        return stop_after_this_round(self.ends, budget=self.budget, finish=self.finish)


def method_budget(index: int, methods: int, left: float, *, evaluate_s: float, grace_s: float) -> float:
    """Seconds the ``index``-th preset run may take of ``left``: the first two share what their probes leave.

    The first (Orchestra) gets 55 % of it, since it trains three encoder passes and
    clusters; the second the rest. Later methods get what is left after their probe.
    """
    if index == 0:
        probes = 3 if methods > 1 else 2  # the untrained encoder's probe too
        return (0.55 if methods > 1 else 1.0) * (left - probes * evaluate_s - grace_s)
    return left - evaluate_s - grace_s


class Check:
    """Runs the parts in order against one deadline and keeps the JSON current."""

    def __init__(self, config: Settings, out: Path, *, deadline_s: float | None = None) -> None:
        self.config, self.out, self.work = config, out, out.parent
        self.start = time.perf_counter()
        self.deadline = None if deadline_s is None else self.start + deadline_s
        self.planned = 0.0
        self.result: dict[str, Any] = {"settings": asdict(config), "parts": {}}
        self.scratch = Path(os.environ.get("GPU_CHECK_RUN_DIR") or tempfile.mkdtemp(prefix="privfed-gpu-check-"))
        self.run_dir = self.scratch / "run"

    def part(self, name: str, body: Callable[[float], dict[str, Any]], *, last: bool = False) -> None:
        """Runs one part with its planned seconds plus whatever earlier parts left; records its figures or its error.

        The last part also takes what check.sh's deadline leaves beyond the plan.
        """
        self.planned += self.config.budgets[name]
        budget = self.planned - (time.perf_counter() - self.start)
        if self.deadline is not None:  # check.sh's timeout: leave the JSON time to be written
            left = self.deadline - time.perf_counter() - 5
            budget = left if last else min(budget, left)
        started = time.perf_counter()

        def so_far() -> dict[str, Any]:  # what a part recorded as it went
            return dict(self.result["parts"].get(name, {}))

        try:
            figures = body(budget)
        except Exception as err:
            figures = {**so_far(), "error": f"{type(err).__name__}: {err}"}
        except KeyboardInterrupt:  # check.sh's timeout: keep what the part has, and end the check
            self._record(name, {**so_far(), "error": "interrupted: check.sh's time ran out"}, started, budget)
            raise
        self._record(name, figures, started, budget)

    def _record(self, name: str, figures: dict[str, Any], started: float, budget: float) -> None:
        figures.update(part_seconds=time.perf_counter() - started, budget_seconds=budget)
        self.result["parts"][name] = figures
        self._write()
        print(f"gpu-check: {name} done in {figures['part_seconds']:.0f}s (budget {budget:.0f}s)", flush=True)

    def _write(self) -> None:
        self.out.write_text(json.dumps(self.result, indent=2) + "\n")

    def privfed(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "privfed.cli", *args]

    def env(self, budget: float) -> dict[str, Any]:
        probe = ("import json, sys, torch, importlib.metadata as m; " + IMPORTS + "; print(json.dumps({"
                 "'python': sys.version.split()[0], 'torch': torch.__version__, 'cuda': torch.version.cuda, "
                 "'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() else None, "
                 "'versions': {n: m.version(n) for n in ('flwr', 'opacus', 'dp-accounting', 'cryptography', "
                 "'grpcio', 'protobuf', 'numpy', 'torchvision', 'typer')}}))")
        figures = run_command([sys.executable, "-c", probe], budget=budget, log=self.work / "env.log")
        if figures["returncode"] == 0:
            figures.update(json.loads(figures["log_tail"][-1]))
        figures["nvidia_smi"] = _nvidia_smi()
        return figures

    def step(self, budget: float) -> dict[str, Any]:
        c = self.config
        out = self.scratch / "step.json"
        figures = run_command(
            [sys.executable, str(HERE / "step_throughput.py"), "--device", c.device, "--batches",
             *c.batches.split(), "--steps", str(c.steps), "--warmup", str(c.warmup), "--backbone", c.backbone,
             "--out", str(out)],
            budget=budget, log=self.work / "step.log", grace=2,
        )
        if out.is_file():  # written after every case, so a step part cut short keeps its finished cases
            figures.update(json.loads(out.read_text()))
        return figures

    def cohort(self, budget: float) -> dict[str, Any]:
        c = self.config
        out = self.scratch / "cohort.json"
        figures = run_command(
            [sys.executable, str(HERE / "cohort_step.py"), "--device", c.device, "--backbone", c.backbone,
             *shlex.split(c.cohort_args), "--out", str(out)],
            budget=budget, log=self.work / "cohort.log", grace=2,
        )
        if out.is_file():  # written after every case
            figures.update(json.loads(out.read_text()))
        return figures

    def train(self, budget: float) -> dict[str, Any]:
        """The paper preset, clients batched, under round_split.py; SIGINT early enough that its grace ends in budget."""
        c = self.config
        split = self.scratch / "split.jsonl"
        args = [
            sys.executable, str(HERE / "round_split.py"), "--split-out", str(split), "--",
            "train", "--config", str(REPO / "configs/paper-cifar10-cross-device.toml"), "--dataset", c.dataset,
            "--num-clients", str(c.clients), "--rounds", str(c.rounds), "--local-epochs", "1", "--device", c.device,
            "--report-client-metrics", "--out", str(self.run_dir), *shlex.split(c.runtime_args), *shlex.split(c.train_args),
        ]
        sampler = GpuSampler(self.work / "train-gpu.csv")
        try:
            figures = run_command(args, budget=max(budget - c.grace_s, 1.0), log=self.work / "train.log", grace=c.grace_s)
        finally:
            figures_gpu = sampler.stop()
        figures["gpu"] = figures_gpu
        if (self.run_dir / "metrics.jsonl").is_file():
            figures.update(round_split(self.run_dir, split))
            try:
                rate = self._batched_rate()
                figures["projected"] = paper_projection(figures["rounds"], images_here=figures["images_here"],
                                                        batched_samples_per_s=rate)
                figures["projected"]["batched_rate_samples_per_s"] = rate
            except ValueError as err:
                figures["projected"] = {"error": str(err)}
        return figures

    def _batched_rate(self) -> float | None:
        """The cohort part's samples/s at its largest cohort (None without one)."""
        cases = [r for r in self.result["parts"].get("cohort", {}).get("cases", []) if r.get("path") == "batched" and "error" not in r]
        return max(cases, key=lambda r: r["clients"])["samples_per_s"] if cases else None

    def presets(self, budget: float) -> dict[str, Any]:
        """The GPU preset per method, the same rounds as the first run reached, then a linear probe of each encoder."""
        c = self.config
        end = time.perf_counter() + budget
        methods = c.methods.split()
        runs: dict[str, dict[str, Any]] = {}
        probes: list[dict[str, Any]] = []
        rounds: int | None = None
        progress = self.result["parts"]["presets"] = {"runs": runs, "linear_probe": probes}  # kept if the check is cut
        for index, method in enumerate(methods):
            left = end - time.perf_counter()
            allowed = method_budget(index, len(methods), left, evaluate_s=c.evaluate_s, grace_s=c.grace_s)
            first = runs[methods[0]].get("seconds") if index else None
            if index >= 2 and (first is None or allowed < first):
                runs[method] = {"skipped": f"{left:.0f} s left; {methods[0]} took {first and round(first)} s"}
                continue
            runs[method] = self._preset_run(method, allowed, rounds)
            if index == 0:
                rounds = progress["rounds"] = runs[method].get("rounds_done") or None
            self._write()
            if runs[method].get("rounds_done"):
                probes.append(self._probe(method, runs[method], end))
                if index == 0:
                    probes.insert(0, self._probe("untrained", runs[method], end, checkpoint="initial"))
                self._write()
        ran = [r for r in runs.values() if "skipped" not in r]
        fine = all(r.get("rounds_done") and r["returncode"] in (0, 130) for r in ran)
        fine = fine and len(probes) == len([r for r in ran if r.get("rounds_done")]) + 1
        fine = fine and all(p["returncode"] == 0 for p in probes)
        return {"returncode": 0 if fine else 1, "rounds": rounds, "runs": runs, "linear_probe": probes}

    def _preset_run(self, method: str, budget: float, rounds: int | None) -> dict[str, Any]:
        c = self.config
        run_dir = self.scratch / "presets" / method
        args = self.privfed(
            "train", "--config", c.preset, "--dataset", c.dataset, "--method", method, "--device", c.device,
            "--out", str(run_dir), *shlex.split(c.runtime_args), *shlex.split(c.preset_args),
            *([] if rounds is None else ["--rounds", str(rounds)]),
        )
        watch = RoundWatch(run_dir / "metrics.jsonl", budget=budget, finish=c.finish_s)
        sampler = GpuSampler(self.scratch / f"{method}-gpu.csv")
        try:
            figures = run_command(args, budget=max(budget, 1.0), log=self.work / "presets.log", grace=c.grace_s,
                                  append=True, watch=watch)
        finally:
            figures_gpu = sampler.stop()
        figures["gpu"] = figures_gpu
        figures.pop("log_tail")
        figures["run_dir"] = str(run_dir)
        metrics = read_jsonl(run_dir / "metrics.jsonl")
        ends = [0.0] + [m["elapsed_seconds"] for m in metrics]
        figures["curve"] = [{"round": m["round"], "wall_s": later - earlier, "knn": m.get("knn_accuracy"),
                             **{key: m.get(key) for key in CURVE_VALUES}} for m, earlier, later in zip(metrics, ends, ends[1:])]
        training = [row["wall_s"] for row in figures["curve"] if row["round"] > 0]
        figures["median_round_s"] = statistics.median(training) if training else None
        if (run_dir / "summary.json").is_file():
            summary = json.loads((run_dir / "summary.json").read_text())
            figures.update(rounds_done=summary["rounds"], stopped_early=summary["stopped_early"],
                           knn=summary["knn_accuracy"], knn_untrained=summary["knn_accuracy_init"])
        return figures

    def _probe(self, name: str, run: dict[str, Any], end: float, *, checkpoint: str = "final") -> dict[str, Any]:
        """``privfed evaluate --protocol linear`` of one run's encoder on the dev images: a row of the probe table."""
        c = self.config
        run_dir = Path(run["run_dir"])
        args = self.privfed("evaluate", str(run_dir), "--protocol", "linear", "--train-data", c.dataset,
                            "--test-data", c.dataset, "--device", c.device, "--checkpoint", checkpoint)
        figures = run_command(args, budget=max(end - time.perf_counter(), c.evaluate_s), log=self.work / "presets.log",
                              grace=2, append=True)
        row = {"encoder": name, "rounds": 0 if checkpoint == "initial" else run.get("rounds_done"),
               "linear_probe": None, "returncode": figures["returncode"], "seconds": figures["seconds"]}
        if figures["returncode"] == 0 and (run_dir / "evaluation.json").is_file():
            row["linear_probe"] = json.loads((run_dir / "evaluation.json").read_text())["evaluations"][-1]["accuracy"]
        return row

    def answers(self) -> dict[str, Any]:
        """Issue 43's figures, as far as they came."""
        parts = self.result["parts"]
        ratios = parts.get("step", {}).get("ratios", {})
        cases = parts.get("step", {}).get("cases", [])
        b16 = next((r for r in cases if r.get("step") == "privfed" and r.get("batch") == 16
                    and r.get("dtype") == "fp32" and not r.get("channels_last") and "error" not in r), None)
        projected = parts.get("train", {}).get("projected", {})
        return {
            "b16_privfed_over_reference": ratios.get("b16_fp32_over_reference"),
            "b16_gpu_util_pct_nvml": None if b16 is None else b16.get("gpu_util_mean"),
            "cohort_speedups": parts.get("cohort", {}).get("speedups"),
            "cohort_aten_ops": parts.get("cohort", {}).get("aten_ops"),
            "paper_round_s": {k: projected.get(f"{k}_s_per_round") for k in ("train", "secagg", "rest")},
            "projected_paper_run_hours": projected.get("run_hours"),
            "train_run_gpu_util_pct": (parts.get("train", {}).get("gpu") or {}).get("util_mean_pct"),
            "preset_rounds": parts.get("presets", {}).get("rounds"),
            "linear_probe": [{k: p[k] for k in ("encoder", "rounds", "linear_probe")}
                             for p in parts.get("presets", {}).get("linear_probe", [])],
        }

    def run(self) -> dict[str, Any]:
        names = self.config.parts.split()
        try:
            for name in names:
                self.part(name, getattr(self, name), last=name == names[-1])
        except KeyboardInterrupt:
            self.result["interrupted"] = True
        self.result["answers"] = self.answers()
        self.result["total_seconds"] = time.perf_counter() - self.start
        self._write()
        return self.result


def _nvidia_smi() -> str | None:
    try:
        return subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")) / "gpu-check.json")
    parser.add_argument("--deadline-s", type=float, default=None, help="seconds until check.sh's timeout ends the check")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = Check(settings(), args.out.resolve(), deadline_s=args.deadline_s).run()
    print(json.dumps({"answers": result["answers"], "total_seconds": result["total_seconds"]}, indent=2))


if __name__ == "__main__":
    main()
