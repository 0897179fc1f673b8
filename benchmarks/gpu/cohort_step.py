"""Samples/s of clients trained together as one batched step against one after another, on one device (issue 43).

The batched path is :func:`privfed.orchestra.cohort_training.train_cohort` at
``--clients`` clients per call; the per-client path is
:func:`privfed.orchestra.client_update.train_locally` followed by the copy of the
client's state to the CPU (what a client sends; the cohort's members come back on
the CPU too). Every client starts from the same model with ``--images`` synthetic
uint8 images of its own, an equal size, so no short batch splits a call. Each case
runs once untimed (cuDNN picks its kernels for the new shapes), then ``--repeats``
times timed, while a thread samples the GPU's utilisation (NVML). One more call of
each path runs under torch's profiler to count the aten ops it issues per step
(the launch proxy of ``benchmarks/ops_per_step.py``), and a cohort's first member,
seeded as the first per-client client, is compared with it (fp32: rounding apart).

    python benchmarks/gpu/cohort_step.py --device cuda --out cohort.json
    python benchmarks/gpu/cohort_step.py --device cpu --backbone resnet8 --clients 1 2 --images 8 --batch 4
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from privfed.config import build_config
from privfed.methods import build_network
from privfed.models import OrchestraNetwork
from privfed.orchestra.client_update import train_locally
from privfed.orchestra.cohort_training import CohortMember, train_cohort, trains_in_cohort
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.orchestra.model_state import StateDict, load_shared_state, shared_state

HERE = Path(__file__).resolve().parent
PAPER_CONFIG = HERE.parents[1] / "configs" / "paper-cifar10-cross-device.toml"


def _sibling(path: Path) -> ModuleType:
    """A benchmark script as a module: ``benchmarks`` is no importable package (opacus ships one of that name)."""
    name = f"privfed_benchmark_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass
class Bench:
    """The round every case trains: one global model and centroids, and equal clients' images (on the CPU)."""

    network: OrchestraNetwork
    global_state: StateDict
    centroids: torch.Tensor
    local: LocalTrainingConfig
    images: list[torch.Tensor]
    device: torch.device

    @property
    def steps_per_client(self) -> int:
        """Steps one client takes (equal clients, so every batch is whole or the same short size)."""
        n, batch = int(self.images[0].shape[0]), self.local.batch_size
        per_epoch = math.ceil(n / batch) - (1 if n % batch == 1 else 0)
        return self.local.epochs * per_epoch

    @property
    def samples_per_client(self) -> int:
        """Sample-steps one client takes (a trailing batch of one is dropped, as local training does)."""
        n, batch = int(self.images[0].shape[0]), self.local.batch_size
        return self.local.epochs * (n - 1 if n % batch == 1 else n)


def bench(*, backbone: str, method: str, batch: int, epochs: int, images: int, clients: int, device: torch.device) -> Bench:
    """The paper cross-device preset's network and local settings (``backbone``, ``batch`` and ``epochs`` aside)."""
    torch.manual_seed(0)
    config = build_config(PAPER_CONFIG, backbone=backbone, method=method, batch_size=batch, local_epochs=epochs, dataset="shapes")
    local = LocalTrainingConfig.from_run(config)
    refusal = trains_in_cohort(local)
    if refusal is not None:
        raise ValueError(refusal)
    network = build_network(config)
    centroids = F.normalize(torch.randn(config.num_global_centroids, network.projection_dim), dim=1)
    pictures = [torch.randint(0, 256, (images, 3, 32, 32), dtype=torch.uint8) for _ in range(clients)]
    return Bench(network.to(device), shared_state(network), centroids, local, pictures, device)


def per_client(b: Bench, count: int) -> list[StateDict]:
    """``count`` clients one after another, each from the global model; their states on the CPU."""
    states = []
    for client in range(count):
        load_shared_state(b.network, b.global_state)
        train_locally(b.network, b.images[client], b.centroids, b.local, generator=_generator(client), device=b.device)
        states.append(shared_state(b.network))
    return states


def batched(b: Bench, count: int) -> list[StateDict]:
    """``count`` clients in one cohort, all in slots at once; their states on the CPU."""
    members = [CohortMember(b.images[client], _generator(client)) for client in range(count)]
    trained = train_cohort(b.network, b.global_state, b.centroids, members, b.local, device=b.device, slots=count)
    return [member.state for member in trained]


def _generator(client: int) -> torch.Generator:
    return torch.Generator().manual_seed(client)


def timed(run: Callable[[], Any], *, repeats: int, device: torch.device, sampler: Any) -> tuple[float, Any, list[int]]:
    """Seconds per call after one untimed call, the last call's result, and the GPU utilisation samples."""
    result = run()
    _synchronize(device)
    with sampler(device) as samples:
        start = time.perf_counter()
        for _ in range(repeats):
            result = run()
        _synchronize(device)
        seconds = (time.perf_counter() - start) / repeats
    return seconds, result, list(samples)


def aten_ops(run: Callable[[], Any], inside: Callable[[Any], bool]) -> tuple[int, int]:
    """Outer and all aten ops one call issues (``inside``: whether an op was called by another aten op)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    aten = [event for event in prof.events() if event.name.startswith("aten::")]
    return sum(1 for event in aten if not inside(event)), len(aten)


def max_difference(a: StateDict, b: StateDict) -> float:
    """Largest absolute difference over the shared entries of two states."""
    return max((float((a[k].double() - b[k].double()).abs().max()) for k in b if a[k].numel()), default=0.0)


def case_row(path: str, clients: int, seconds: float, b: Bench, samples: list[int]) -> dict[str, Any]:
    """One case's figures: sample-steps per second over the clients, per call and per client."""
    sample_steps = clients * b.samples_per_client
    return {
        "path": path, "clients": clients, "seconds_per_call": seconds, "samples_per_s": sample_steps / seconds,
        "ms_per_client_step": 1000 * seconds / (clients * b.steps_per_client),
        "gpu_util_mean": sum(samples) / len(samples) if samples else None, "gpu_util_samples": len(samples),
        "memory_max_gib": torch.cuda.max_memory_allocated(b.device) / 2**30 if b.device.type == "cuda" else None,
    }


def run(
    *, device: torch.device, clients: list[int], per_client_clients: int, images: int, batch: int, epochs: int,
    repeats: int, backbone: str = "resnet18", method: str = "orchestra", ops_clients: int | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """The per-client case, then each cohort size; ``out`` is rewritten after every case, a failed case keeps its error."""
    sampler = _sibling(HERE / "step_throughput.py").utilisation_sampler
    b = bench(backbone=backbone, method=method, batch=batch, epochs=epochs, images=images,
              clients=max([*clients, per_client_clients, ops_clients or 0]), device=device)
    result: dict[str, Any] = {
        "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__, "backbone": backbone, "method": method, "batch": batch, "epochs": epochs,
        "images_per_client": images, "steps_per_client": b.steps_per_client, "samples_per_client": b.samples_per_client,
        "repeats": repeats, "cases": [],
    }
    reference: list[StateDict] = []

    def record(row: dict[str, Any]) -> None:
        print(json.dumps(row), flush=True)
        result["cases"].append(row)
        result["speedups"] = speedups(result["cases"])
        if out is not None:
            out.write_text(json.dumps(result, indent=2) + "\n")

    cases = [("per_client", per_client_clients)] + [("batched", count) for count in clients]
    for path, count in cases:
        try:
            _reset_peak(device)
            body = (lambda n=count: per_client(b, n)) if path == "per_client" else (lambda n=count: batched(b, n))
            seconds, states, samples = timed(body, repeats=repeats, device=device, sampler=sampler)
            row = case_row(path, count, seconds, b, samples)
            if path == "per_client":
                reference = states
            elif reference:
                row["max_abs_diff_first_client"] = max_difference(states[0], reference[0])
        except Exception as err:
            row = {"path": path, "clients": count, "error": f"{type(err).__name__}: {err}"}
        record(row)
    if ops_clients:
        try:
            result["aten_ops"] = ops_per_step(b, ops_clients)
        except Exception as err:
            result["aten_ops"] = {"error": f"{type(err).__name__}: {err}"}
        if out is not None:
            out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def ops_per_step(b: Bench, clients: int) -> dict[str, Any]:
    """Aten ops per step of one client alone, and per batched step of ``clients`` (and per client-step)."""
    inside = _sibling(HERE.parent / "ops_per_step.py").inside_aten
    alone_outer, alone_all = aten_ops(lambda: per_client(b, 1), inside)
    cohort_outer, cohort_all = aten_ops(lambda: batched(b, clients), inside)
    steps = b.steps_per_client
    return {
        "per_client_outer_per_step": alone_outer / steps, "per_client_all_per_step": alone_all / steps,
        "batched_clients": clients, "batched_outer_per_step": cohort_outer / steps, "batched_all_per_step": cohort_all / steps,
        "batched_outer_per_client_step": cohort_outer / (steps * clients),
        "note": "whole calls (state loads and copies to the CPU included) over the steps one client takes",
    }


def speedups(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each cohort size's samples/s over the per-client path's."""
    alone = next((r for r in rows if r["path"] == "per_client" and "error" not in r), None)
    if alone is None:
        return {}
    return {f"batched_{r['clients']}_over_per_client": r["samples_per_s"] / alone["samples_per_s"]
            for r in rows if r["path"] == "batched" and "error" not in r}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--method", default="orchestra")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 16, 50], help="clients per batched call")
    parser.add_argument("--per-client-clients", type=int, default=4, help="clients the per-client path trains per call")
    parser.add_argument("--images", type=int, default=64, help="images per client")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2, help="local epochs per call")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per case, after one untimed")
    parser.add_argument("--ops-clients", type=int, default=8, help="count aten ops at this cohort size (0: skip)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here (after every case)")
    args = parser.parse_args(argv)
    result = run(
        device=torch.device(args.device), clients=args.clients, per_client_clients=args.per_client_clients,
        images=args.images, batch=args.batch, epochs=args.epochs, repeats=args.repeats, backbone=args.backbone,
        method=args.method, ops_clients=args.ops_clients or None, out=args.out,
    )
    print(json.dumps({"speedups": result.get("speedups"), "aten_ops": result.get("aten_ops")}, indent=2))


if __name__ == "__main__":
    main()
