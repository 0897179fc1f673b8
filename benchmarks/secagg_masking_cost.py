"""CPU seconds of SecAgg+'s arithmetic per client for the paper's ResNet-18 (issue 43): quantising, masking, unmasking.

The update is the network of ``configs/paper-cifar10-cross-device.toml``'s
shared state (every floating-point tensor, 23.4 M values), encoded as the
client's SecAgg+ mod receives it (:func:`privfed.secagg.encoding.encode_update`).
Timed, one call each:

- ``quantise``: :func:`privfed.secagg.masking.encode_update`
  (the weight factor, Flower's stochastic quantisation);
- ``mask, k neighbours``: :func:`~privfed.secagg.masking.mask_update`
  with the private mask and ``k`` pairwise masks;
- ``unmask, per dropped client``: :func:`~privfed.secagg.masking.unmask_sum`
  taking one dropped client's ``k`` pairwise masks off the sum;
- ``int64 sums`` (in-process only): the masking in int64 arrays, from
  :func:`~privfed.secagg.masks.expand_mask`, as the code before the uint32
  words summed (and as any modulus but a power of two still does).

Each setting runs once to warm up (``first``: workers start, pages fault
in), then ``--repeats`` times; the table gives the median and the range of
wall time and of this process's CPU time (the workers' not included). ``--workers``
lists pool sizes (0: in-process). Run against code from before the mask
pool (no ``privfed.secagg.mask_pool``), it times that code in-process.

    python benchmarks/secagg_masking_cost.py
    python benchmarks/secagg_masking_cost.py --neighbours 4 8 --workers 0 2 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from privfed.config import build_config
from privfed.methods import build_network
from privfed.orchestra.model_state import shared_state
from privfed.secagg import encoding
from privfed.secagg.masking import encode_update, mask_update, unmask_sum

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "paper-cifar10-cross-device.toml"
CLIPPING, LEVELS, MODULUS, MAX_WEIGHT = 8.0, 2**22, 2**32, 100.0


def resnet18_update() -> list[np.ndarray]:
    """A ResNet-18 delta of the paper's network, as the client's SecAgg+ mod gets it (scaled, with indicators)."""
    state = shared_state(build_network(build_config(CONFIG, device="cpu")))
    rng = np.random.default_rng(0)
    delta = [rng.normal(0, 0.01, tuple(t.shape)).astype(np.float32) for t in state.values()]
    scales = encoding.initial_scales(list(state))
    ratio = encoding.secagg_weight_ratio(50, max_weight=MAX_WEIGHT, quantization_range=LEVELS)
    return encoding.encode_update(delta, scales, weight_ratio=ratio, clipping_range=CLIPPING, quantization_range=LEVELS)


def pool_kwargs(workers: int | None) -> dict[str, Any]:
    """``pool=`` for the masking calls (None: the code under test has no pool argument)."""
    if workers is None:
        return {}
    from privfed.secagg.mask_pool import MaskPool

    return {"pool": MaskPool(workers)}


def timed(call: Callable[[], Any]) -> tuple[float, float]:
    """Wall seconds, and CPU seconds of this process (the workers' not included)."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def int64_sums(encoded: list[np.ndarray], private: bytes, seeds: dict[int, bytes]) -> list[np.ndarray]:
    """The same masking with int64 masks and sums (v3's words; the arithmetic before the uint32 words)."""
    from privfed.secagg.mask_pool import _add_masks_int64

    terms = [(private, 1), *((seed, -1) for seed in seeds.values())]
    return _add_masks_int64(encoded, terms, MODULUS, [a.shape for a in encoded])


def stages(update: list[np.ndarray], neighbours: list[int], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """The calls to time, by row name."""
    encoded = encode_update(update, 50, max_weight=MAX_WEIGHT, clipping_range=CLIPPING, quantization_range=LEVELS)
    private = os.urandom(32)
    calls: dict[str, Callable[[], Any]] = {
        "quantise": lambda: encode_update(update, 50, max_weight=MAX_WEIGHT, clipping_range=CLIPPING, quantization_range=LEVELS),
    }
    for k in neighbours:
        seeds = {node: os.urandom(32) for node in range(1, k + 1)}
        calls[f"mask, {k} neighbours"] = lambda s=seeds: mask_update(
            encoded, node_id=0, private_seed=private, pairwise_seeds=s, modulus=MODULUS, **kwargs
        )
        if kwargs.get("pool") is not None and kwargs["pool"].workers == 0:
            calls[f"mask, {k} neighbours, int64 sums"] = lambda s=seeds: int64_sums(encoded, private, s)
    masked = mask_update(encoded, node_id=0, private_seed=private, pairwise_seeds={}, modulus=MODULUS, **kwargs)
    for k in neighbours:
        dropped = {0: {node: os.urandom(32) for node in range(1, k + 1)}}
        calls[f"unmask, 1 dropped of {k} neighbours"] = lambda d=dropped: unmask_sum(
            masked, private_seeds={}, dropped_pairwise_seeds=d, modulus=MODULUS, **kwargs
        )
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neighbours", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, len(os.sched_getaffinity(0))],
                        help="pool sizes to time (0: in-process)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    try:
        import privfed.secagg.mask_pool  # noqa: F401
        settings: list[int | None] = list(args.workers)
    except ImportError:
        settings = [None]
    update = resnet18_update()
    print(f"ResNet-18 shared state: {len(update) - 2} tensors, {sum(a.size for a in update):,} values; "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; seconds, median [min-max] of {args.repeats}")
    for workers in settings:
        kwargs = pool_kwargs(workers)
        if workers is not None and workers > 1:  # a first job of one 8M-word mask: the workers start
            start = timed(partial(kwargs["pool"].add_masks, [np.zeros(1 << 23, np.int64)], [(os.urandom(32), 1)], MODULUS))
            print(f"\n{workers} workers start: first job of one 8M-word mask {start[0]:.2f} s")
        calls = stages(update, args.neighbours, kwargs)
        first = {name: timed(call)[0] for name, call in calls.items()}  # warm-up: workers start, pages fault in
        times = {name: [timed(call) for _ in range(args.repeats)] for name, call in calls.items()}
        label = "code without a pool" if workers is None else f"{workers} workers" if workers > 1 else "in-process"
        print(f"\n{label}")
        print(f"{'':>34} {'first':>6} {'wall s':>21} {'CPU s, this process':>21}")
        for name, runs in times.items():
            walls, cpus = [run[0] for run in runs], [run[1] for run in runs]
            print(f"{name:>34} {first[name]:>6.2f} {spread(walls):>21} {spread(cpus):>21}")
        if "pool" in kwargs:
            kwargs["pool"].close()


if __name__ == "__main__":
    main()
