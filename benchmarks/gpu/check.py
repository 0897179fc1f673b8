"""The GPU readiness check's parts, each under its own time budget, gathered into one JSON (issue 32, item 3).

Parts: ``env`` (card, torch, nvidia-smi, that privfed's imports resolve), ``step``
(:mod:`benchmarks.gpu.step_throughput`), ``train`` (a short run of the paper's
cross-device preset on the dev images, per-round times and GPU memory, projected to
the paper's 100 rounds × 10 local epochs), ``attack`` (decoder) and ``evaluate``
(linear probe) on that run. Each part runs as a subprocess: one that fails or runs out
of time records why, and the rest still run. The JSON is rewritten after every part,
so a killed check still leaves what it measured. ``benchmarks/gpu/check.sh`` installs
the wheels and calls this; sizes come from ``GPU_CHECK_*`` variables (:func:`settings`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
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
PAPER = {"rounds": 100, "local_epochs": 10, "clients_per_round": 50, "images_per_client": 500, "eval_every": 10}
CIFAR10_TRAIN, CIFAR10_TEST = 50_000, 10_000
IMPORTS = "import privfed.cli, flwr, opacus, dp_accounting, cryptography, privfed.federation.server_app, privfed.federation.client_app"


@dataclass(frozen=True)
class Settings:
    """Everything the check's size depends on; :func:`settings` reads them from the environment."""

    device: str
    dataset: str
    clients: int
    rounds: int
    runtime_args: str  # "--runtime local" on the GPU; "" runs the default runtime
    train_args: str  # extra `privfed train` flags (the toy size shrinks the model here)
    batches: str
    steps: int
    warmup: int
    backbone: str
    attack_args: str
    budgets: dict[str, float]  # seconds planned per part; time a part leaves over goes to the next


def settings(env: dict[str, str] | os._Environ[str] = os.environ) -> Settings:
    """The GPU sizes, or the toy CPU sizes under ``GPU_CHECK_TOY=1``; any ``GPU_CHECK_<FIELD>`` overrides one."""
    toy = env.get("GPU_CHECK_TOY") == "1"
    base = Settings(
        device="cpu" if toy else "cuda",
        dataset="shapes:96" if toy else f"arrays:{REPO / '.gpu-wheelhouse/data/cifar10-dev.npz'}",
        # On an H100, 50 clients per round (the preset's 100 at half participation) did not finish round 1 in
        # 260 s: SecAgg+ masking and quantising on the CPU take ~2.5 s per client (docs/performance.md).
        clients=3 if toy else 32,
        rounds=1 if toy else 2,
        runtime_args="--runtime local",
        train_args=(
            "--backbone resnet8 --projection-dim 32 --num-global-centroids 8 --participation 1 --client-gpus 0"
            if toy else "--participation 0.5"
        ),
        batches="4" if toy else "16 64 256",
        steps=1 if toy else 20,
        warmup=1 if toy else 5,
        backbone="resnet8" if toy else "resnet18",
        attack_args="--steps 5 --max-vectors 4" if toy else "",
        budgets={"env": 20, "step": 85, "train": 200, "attack": 65, "evaluate": 35},
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
    return Settings(**values)


def run_command(args: list[str], *, budget: float, log: Path, grace: float = 30.0) -> dict[str, Any]:
    """Runs ``args`` with its output in ``log``; past ``budget`` it gets SIGINT (privfed stops cleanly), then SIGKILL."""
    start = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=max(budget, 1.0))
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            code = _interrupt(process, grace)
        finally:  # the check itself interrupted: its own session would outlive the device command
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    return {"command": shlex.join(args), "returncode": code, "timed_out": timed_out,
            "seconds": time.perf_counter() - start, "log_tail": _tail(log)}


def _interrupt(process: subprocess.Popen[bytes], grace: float) -> int:
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


def projection(run_dir: Path) -> dict[str, Any]:
    """A run's rounds split into local training and the rest, and scaled to the paper's run.

    A round's wall time is its ``round_seconds`` plus what the driver does after it
    (checkpoint, recording, kNN when due): the growth of ``elapsed_seconds``. Local
    training is ``clients × mean train_seconds`` (clients train one after another on the
    local runtime; on Ray this split does not hold); the rest (release, SecAgg+, global
    clustering, messages, checkpoints) is the wall time less that. A step's time is local
    training over the round's steps, counted from the run's own partition.
    """
    from privfed.config import load_saved_config
    from privfed.data.federated import FederatedSplit

    config = load_saved_config(run_dir / "config.json")
    sizes = FederatedSplit.of(config).client_sizes()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rounds, previous = [], 0.0
    for record in records:
        row = {"round": record["round"], "round_s": record["round_seconds"], "wall_s": record["elapsed_seconds"] - previous,
               "clients": record["clients_completed"], "knn": record.get("knn_accuracy")}
        previous = record["elapsed_seconds"]
        if record["round"] > 0 and record.get("train_seconds") is not None:
            steps = config.local_epochs * sum(client_steps(sizes[c], config.batch_size) for c in record["sampled_clients"])
            local = record["clients"] * record["train_seconds"]
            row.update(local_train_s=local, rest_s=row["wall_s"] - local, steps=steps, step_ms=1000 * local / max(steps, 1),
                       release_s_per_client=record.get("release_seconds"))
        rounds.append(row)
    out: dict[str, Any] = {"rounds": rounds, "images_per_client_here": statistics.fmean(sizes)}
    if any("step_ms" in r for r in rounds):
        out["projected"] = paper_projection(rounds, batch_size=config.batch_size, images_here=_dataset_images(config))
    return out


def paper_projection(rounds: list[dict[str, Any]], *, batch_size: int, images_here: int) -> dict[str, Any]:
    """The paper run's wall time from the medians of the measured training rounds.

    The paper's round has 50 clients × 10 epochs × ``client_steps(500, 16)`` steps and,
    assumed, the same rest as here. A kNN evaluation costs what an evaluated round's rest
    exceeds the others' by, scaled by CIFAR-10's images over the images here.
    """
    trained = [r for r in rounds if "step_ms" in r]
    plain = [r for r in trained if r["knn"] is None] or trained
    step_s = statistics.median(r["step_ms"] for r in trained) / 1000
    rest_s = statistics.median(r["rest_s"] for r in plain)
    evaluated = [r["rest_s"] - rest_s for r in trained if r["knn"] is not None and plain is not trained]
    eval_s = statistics.fmean(evaluated) * (CIFAR10_TRAIN + CIFAR10_TEST) / images_here if evaluated else 0.0
    steps = PAPER["clients_per_round"] * PAPER["local_epochs"] * client_steps(PAPER["images_per_client"], batch_size)
    local_s = steps * step_s
    round0_s = next((r["wall_s"] for r in rounds if r["round"] == 0), 0.0)
    total = round0_s + PAPER["rounds"] * (local_s + rest_s) + eval_s * PAPER["rounds"] / PAPER["eval_every"]
    return {
        "step_ms": 1000 * step_s, "steps_per_round": steps, "local_train_s_per_round": local_s,
        "rest_s_per_round": rest_s, "round_s": local_s + rest_s, "knn_eval_s": eval_s, "round0_s": round0_s,
        "run_hours": total / 3600, "local_share": PAPER["rounds"] * local_s / total,
        "how": "round 0 + 100 x (50 clients x 10 epochs x 32 steps x median step + median rest of a round) "
               "+ 10 kNN evaluations scaled by CIFAR-10's image count",
    }


def _dataset_images(config: Any) -> int:
    from privfed.data.federated import cached_dataset

    return sum(len(cached_dataset(config.dataset, s, config.data_dir, False)) for s in ("train", "test"))


class Check:
    """Runs the parts in order against one deadline and keeps the JSON current."""

    def __init__(self, config: Settings, out: Path) -> None:
        self.config, self.out, self.work = config, out, out.parent
        self.start = time.perf_counter()
        self.planned = 0.0
        self.result: dict[str, Any] = {"settings": asdict(config), "parts": {}}
        self.run_dir = Path(os.environ.get("GPU_CHECK_RUN_DIR") or tempfile.mkdtemp(prefix="privfed-gpu-check-")) / "run"

    def part(self, name: str, body: Callable[[float], dict[str, Any]]) -> None:
        """Runs one part with its planned seconds plus whatever earlier parts left; records its figures or its error."""
        self.planned += self.config.budgets[name]
        budget = self.planned - (time.perf_counter() - self.start)
        started = time.perf_counter()
        try:
            figures = body(budget)
        except Exception as err:
            figures = {"error": f"{type(err).__name__}: {err}"}
        figures["part_seconds"] = time.perf_counter() - started
        figures["budget_seconds"] = budget
        self.result["parts"][name] = figures
        self.out.write_text(json.dumps(self.result, indent=2) + "\n")
        print(f"gpu-check: {name} done in {figures['part_seconds']:.0f}s (budget {budget:.0f}s)", flush=True)

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
        out = self.work / "step.json"
        figures = run_command(
            [sys.executable, str(REPO / "benchmarks/gpu/step_throughput.py"), "--device", c.device, "--batches",
             *c.batches.split(), "--steps", str(c.steps), "--warmup", str(c.warmup), "--backbone", c.backbone,
             "--out", str(out)],
            budget=budget, log=self.work / "step.log", grace=2,
        )
        if out.is_file():  # written after every case, so a step part cut short keeps its finished cases
            figures.update(json.loads(out.read_text()))
            out.unlink()  # its figures are in the check's JSON
        return figures

    def train(self, budget: float) -> dict[str, Any]:
        c = self.config
        args = self.privfed(
            "train", "--config", str(REPO / "configs/paper-cifar10-cross-device.toml"), "--dataset", c.dataset,
            "--num-clients", str(c.clients), "--rounds", str(c.rounds), "--local-epochs", "1", "--device", c.device,
            "--record-releases", "--report-client-metrics", "--out", str(self.run_dir),
            *shlex.split(c.runtime_args), *shlex.split(c.train_args),
        )
        sampler = GpuSampler(self.work / "train-gpu.csv")
        try:  # past its budget the run gets SIGINT and a minute to finish its round and write final.pt
            figures = run_command(args, budget=budget, log=self.work / "train.log", grace=60)
        finally:
            figures_gpu = sampler.stop()
        figures["gpu"] = figures_gpu
        if (self.run_dir / "metrics.jsonl").is_file():
            figures.update(projection(self.run_dir))
        return figures

    def attack(self, budget: float) -> dict[str, Any]:
        args = self.privfed("attack", str(self.run_dir), "--method", "decoder", "--device", self.config.device,
                            *shlex.split(self.config.attack_args))
        figures = run_command(args, budget=budget, log=self.work / "attack.log", grace=2)
        if (self.run_dir / "attack.json").is_file():
            figures["result"] = json.loads((self.run_dir / "attack.json").read_text())
            shutil.copyfile(self.run_dir / "attack.png", self.work / "attack.png")
        return figures

    def evaluate(self, budget: float) -> dict[str, Any]:
        c = self.config
        args = self.privfed("evaluate", str(self.run_dir), "--protocol", "linear", "--train-data", c.dataset,
                            "--test-data", c.dataset, "--device", c.device)
        figures = run_command(args, budget=budget, log=self.work / "evaluate.log", grace=2)
        if (self.run_dir / "evaluation.json").is_file():
            figures["result"] = json.loads((self.run_dir / "evaluation.json").read_text())["evaluations"][-1]
        return figures

    def answers(self) -> dict[str, Any]:
        """Issue 32 item 5, as far as the figures go."""
        parts = self.result["parts"]
        ratios = parts.get("step", {}).get("ratios", {})
        cases = parts.get("step", {}).get("cases", [])
        b16 = next((r for r in cases if r.get("step") == "privfed" and r.get("batch") == 16
                    and r.get("dtype") == "fp32" and not r.get("channels_last") and "error" not in r), None)
        projected = parts.get("train", {}).get("projected", {})
        return {
            "b16_privfed_over_reference": ratios.get("b16_fp32_over_reference"),
            "b16_privfed_over_reference_model": ratios.get("b16_fp32_over_reference_model"),
            "b16_at_least_1.3x": None if "b16_fp32_over_reference" not in ratios else ratios["b16_fp32_over_reference"] >= 1.3,
            "projected_paper_run_hours": projected.get("run_hours"),
            "projected_local_training_share": projected.get("local_share"),
            "b16_gpu_util_pct_nvml": None if b16 is None else b16.get("gpu_util_mean"),
            "train_run_gpu_util_pct": (parts.get("train", {}).get("gpu") or {}).get("util_mean_pct"),
        }

    def run(self) -> dict[str, Any]:
        for name in ("env", "step", "train", "attack", "evaluate"):
            self.part(name, getattr(self, name))
        self.result["answers"] = self.answers()
        self.result["total_seconds"] = time.perf_counter() - self.start
        self.out.write_text(json.dumps(self.result, indent=2) + "\n")
        return self.result


def _nvidia_smi() -> str | None:
    try:
        return subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")) / "gpu-check.json")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = Check(settings(), args.out.resolve()).run()
    print(json.dumps({"answers": result["answers"], "total_seconds": result["total_seconds"]}, indent=2))


if __name__ == "__main__":
    main()
