"""Samples/s of privfed's Orchestra training step against an official-style step, on one device.

privfed's step augments the batch on the device (:func:`privfed.data.augment.orchestra_views`)
and runs three encoder passes; it is timed in fp32 and under bf16 autocast, with the
network in channels_last or not. The reference is written after the paper and
DESIGN.md §4 (not the authors' code): torchvision-style augmentation image by image on the
CPU (PIL), then four encoder passes (online on view 1, unused, as the official code does),
fp32, contiguous. It is timed twice: with its augmentation in the step, as a loader without
workers runs it, and with the views made beforehand (``reference_model``), the bound a loader
with enough workers could reach. While each case runs, a thread samples the GPU's
utilisation (NVML, through ``torch.cuda.utilization``) to say how busy one client keeps it.

    python benchmarks/gpu/step_throughput.py --device cuda --out step.json
    python benchmarks/gpu/step_throughput.py --device cpu --backbone resnet8 --batches 4 --steps 1 --warmup 1
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torchvision import transforms as T

from privfed.config import build_config
from privfed.data.augment import NORM_MEAN, NORM_STD
from privfed.methods import Batch, build_network, get_method
from privfed.methods.losses import cluster_consistency_loss, rotation_loss
from privfed.models import OrchestraNetwork, ema_update

PAPER_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "paper-cifar10-cross-device.toml"
Step = Callable[[], None]


@dataclass(frozen=True)
class Case:
    """One timed configuration of the step."""

    step: str  # "privfed", "reference" or "reference_model"
    batch: int
    dtype: str = "fp32"  # or "bf16" (autocast)
    channels_last: bool = False


def build_cases(batches: list[int], *, bf16: bool) -> list[Case]:
    """privfed's step in every dtype × layout, and the reference's two variants, per batch size."""
    dtypes = ["fp32", "bf16"] if bf16 else ["fp32"]
    cases = []
    for batch in batches:
        cases += [Case("privfed", batch, d, cl) for d in dtypes for cl in (False, True)]
        cases += [Case("reference", batch), Case("reference_model", batch)]
    return cases


def paper_network(backbone: str, device: torch.device) -> tuple[OrchestraNetwork, Any]:
    """The paper cross-device setting's network (or another backbone), and its run configuration."""
    config = build_config(PAPER_CONFIG, backbone=backbone, dataset="shapes")
    return build_network(config).to(device).train(), config


def sgd(network: OrchestraNetwork, config: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        network.trainable_parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )


def privfed_step(
    network: OrchestraNetwork, config: Any, images: torch.Tensor, centroids: torch.Tensor, case: Case
) -> Step:
    """privfed's local step (:func:`privfed.orchestra.client_update.train_locally`'s loop body) on one batch."""
    optimizer = sgd(network, config)
    generator = torch.Generator(device=images.device).manual_seed(0)
    method = get_method(config.method)
    memory_format = torch.channels_last if case.channels_last else torch.contiguous_format
    network.to(memory_format=memory_format)

    def step() -> None:
        with _autocast(images.device, case.dtype):
            losses = method.step(network, Batch(images, None, centroids, config.temperature, generator))
        optimizer.zero_grad(set_to_none=True)
        losses.loss.backward()
        optimizer.step()
        ema_update(network.target, network.online, config.ema_decay)

    return step


def reference_transforms(blur_p: float, solarize_p: float) -> T.Compose:
    """One view of the paper's augmentation, image by image on PIL images (DESIGN.md §4)."""
    return T.Compose([
        T.RandomResizedCrop(32, scale=(0.5, 1.0), interpolation=T.InterpolationMode.BICUBIC),
        T.RandomHorizontalFlip(),
        T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
        T.RandomGrayscale(p=0.2),
        T.RandomApply([T.GaussianBlur(3, sigma=(0.1, 2.0))], p=blur_p),
        T.RandomSolarize(128, p=solarize_p),
        T.ToTensor(),
        T.Normalize([NORM_MEAN] * 3, [NORM_STD] * 3),
    ])


def reference_views(pictures: list[Image.Image]) -> tuple[torch.Tensor, ...]:
    """Views 1, 2 and the rotated view 3 (full view-1 augmentation, then k quarter turns) and k, on the CPU.

    One torch thread, as in a loader's worker: on 32×32 images more threads only add overhead
    (64 images took 0.33 s on one thread and minutes on a loaded 2-core machine's default).
    """
    view1, view2 = reference_transforms(0.5, 0.0), reference_transforms(0.1, 0.2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x1 = torch.stack([view1(p) for p in pictures])
        x2 = torch.stack([view2(p) for p in pictures])
        turns = [random.randrange(4) for _ in pictures]
        x3 = torch.stack([torch.rot90(view1(p), k, dims=(1, 2)) for p, k in zip(pictures, turns)])
    finally:
        torch.set_num_threads(threads)
    return x1, x2, x3, torch.tensor(turns)


def reference_step(
    network: OrchestraNetwork, config: Any, images: torch.Tensor, centroids: torch.Tensor, *, augment: bool
) -> Step:
    """The official-style step: CPU views (per step, or made once when ``augment`` is False), four passes, fp32."""
    optimizer = sgd(network, config)
    network.to(memory_format=torch.contiguous_format)
    pictures = [Image.fromarray(image.permute(1, 2, 0).numpy()) for image in images.cpu()]
    device = centroids.device
    fixed = None if augment else [t.to(device) for t in reference_views(pictures)]

    def step() -> None:
        views = fixed if fixed is not None else [t.to(device, non_blocking=True) for t in reference_views(pictures)]
        x1, x2, x3, turns = views
        network.online(x1)  # the official code's unused online pass on view 1
        online2 = F.normalize(network.online(x2), dim=1)
        with torch.no_grad():
            target1 = F.normalize(network.target(x1), dim=1)
        loss = cluster_consistency_loss(target1, online2, centroids, config.temperature)
        loss = loss + rotation_loss(network.head("rotation")(network.online(x3)), turns)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ema_update(network.target, network.online, config.ema_decay)

    return step


def time_steps(step: Step, *, steps: int, warmup: int, device: torch.device) -> float:
    """Seconds per step after ``warmup`` untimed steps (the device is synchronised around the timed ones)."""
    for _ in range(warmup):
        step()
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _synchronize(device)
    return (time.perf_counter() - start) / steps


@contextlib.contextmanager
def utilisation_sampler(device: torch.device, every_s: float = 0.05) -> Iterator[list[int]]:
    """Collects the GPU's utilisation percentages (NVML) while the block runs; none off CUDA or without NVML."""
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every_s):
            try:
                samples.append(int(torch.cuda.utilization(device)))
            except Exception:  # NVML went away: keep what was sampled
                return

    thread = None
    if device.type == "cuda":
        try:
            torch.cuda.utilization(device)
            thread = threading.Thread(target=sample, daemon=True)
            thread.start()
        except Exception:  # no pynvml / NVML: the figure stays empty
            thread = None
    try:
        yield samples
    finally:
        stop.set()
        if thread is not None:
            thread.join()


def measure_case(case: Case, *, backbone: str, device: torch.device, steps: int, warmup: int) -> dict[str, Any]:
    """One case's samples/s, seconds per step and mean GPU utilisation, on a fresh network and fixed images."""
    torch.manual_seed(0)
    random.seed(0)
    network, config = paper_network(backbone, device)
    images = torch.randint(0, 256, (case.batch, 3, 32, 32), dtype=torch.uint8, device=device)
    centroids = F.normalize(torch.randn(config.num_global_centroids, config.projection_dim, device=device), dim=1)
    if case.step == "privfed":
        step = privfed_step(network, config, images, centroids, case)
    else:
        step = reference_step(network, config, images, centroids, augment=case.step == "reference")
    with utilisation_sampler(device) as samples:
        seconds = time_steps(step, steps=steps, warmup=warmup, device=device)
    return {
        **dataclasses.asdict(case),
        "samples_per_s": case.batch / seconds,
        "ms_per_step": 1000 * seconds,
        "gpu_util_mean": sum(samples) / len(samples) if samples else None,
        "gpu_util_samples": len(samples),
    }


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """privfed fp32 (contiguous) and best privfed over each reference variant, per batch (issue 32 item 5),
    and privfed fp32's samples/s at each batch over the smallest batch's."""
    out = {}
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch and r["step"] == "privfed"]
        plain = next((r for r in mine if r["dtype"] == "fp32" and not r["channels_last"]), None)
        best = max(mine, key=lambda r: r["samples_per_s"], default=None)
        for ref in ("reference", "reference_model"):
            other = next((r for r in rows if r["batch"] == batch and r["step"] == ref), None)
            if other and plain and best:
                out[f"b{batch}_fp32_over_{ref}"] = plain["samples_per_s"] / other["samples_per_s"]
                out[f"b{batch}_best_over_{ref}"] = best["samples_per_s"] / other["samples_per_s"]
        if plain and batch != min(r["batch"] for r in rows):
            smallest = min(r["batch"] for r in rows)
            base = next((r for r in rows if r["batch"] == smallest and r["step"] == "privfed" and r["dtype"] == "fp32"
                         and not r["channels_last"]), None)
            if base:  # what training several clients' batches at once could gain at most
                out[f"b{batch}_over_b{smallest}_privfed_fp32"] = plain["samples_per_s"] / base["samples_per_s"]
    return out


def run(
    *, device: torch.device, batches: list[int], steps: int, warmup: int, backbone: str = "resnet18",
    out: Path | None = None,
) -> dict[str, Any]:
    """Every case, after one untimed case warms the device up; ``out`` is rewritten after each case.

    A case that fails (out of memory at one batch size, say) records its error and the rest still run.
    """
    cases = build_cases(batches, bf16=device.type == "cuda")
    measure_case(cases[0], backbone=backbone, device=device, steps=1, warmup=1)  # CUDA context, cuBLAS, cuDNN
    result: dict[str, Any] = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "backbone": backbone,
        "steps": steps,
        "warmup": warmup,
        "cases": [],
    }
    for case in cases:
        try:
            row = measure_case(case, backbone=backbone, device=device, steps=steps, warmup=warmup)
        except Exception as err:
            row = {**dataclasses.asdict(case), "error": f"{type(err).__name__}: {err}"}
        print(json.dumps(row), flush=True)
        result["cases"].append(row)
        result["ratios"] = ratios([r for r in result["cases"] if "error" not in r])
        if out is not None:
            out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager[Any]:
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per case")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (cuDNN picks its kernels)")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here (after every case)")
    args = parser.parse_args(argv)
    result = run(
        device=torch.device(args.device), batches=args.batches, steps=args.steps, warmup=args.warmup,
        backbone=args.backbone, out=args.out,
    )
    print(json.dumps(result["ratios"], indent=2))


if __name__ == "__main__":
    main()
