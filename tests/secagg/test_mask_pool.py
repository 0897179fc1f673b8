"""Masks added across worker processes: the same bytes as in-process, under fork, without a pool, and at exit."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import privfed
from privfed.secagg.mask_pool import WORKERS_ENV, MaskPool, default_workers
from privfed.secagg.masks import expand_mask

SHAPES = [(1,), (3, 1000), (5,), (2, 2, 777)]


def encoded(seed: int = 0) -> list[np.ndarray]:
    """A client's integers as the masking gets them: an int64 factor, int32 values, an int64 vector."""
    rng = np.random.default_rng(seed)
    dtypes = [np.int64, np.int32, np.int32, np.int64]
    return [rng.integers(0, 2**22, shape).astype(dtype) for shape, dtype in zip(SHAPES, dtypes)]


TERMS = [(os.urandom(32), 1), (os.urandom(44), -1), (os.urandom(32), -1), (os.urandom(32), 1)]


def reference(arrays: list[np.ndarray], modulus: int) -> list[np.ndarray]:
    """The sum in Python-exact int64 from :func:`expand_mask`, the specified masks."""
    total = [a.astype(np.int64) for a in arrays]
    for seed, sign in TERMS:
        total = [t + sign * m for t, m in zip(total, expand_mask(seed, modulus, SHAPES))]
    return [np.mod(t, modulus) for t in total]


def same_bytes(got: list[np.ndarray], expected: list[np.ndarray]) -> bool:
    return all(a.dtype == np.int64 and a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(got, expected, strict=True))


@pytest.fixture(scope="module")
def pool():
    """Two workers that take every job, however small."""
    pool = MaskPool(2, min_words=0)
    yield pool
    pool.close()


@pytest.mark.parametrize("modulus", [2**32, 2**16, 1000])
def test_the_pool_and_this_process_give_the_same_bytes_the_specified_masks_give(pool, modulus):
    arrays = encoded()
    alone = MaskPool(0).add_masks(arrays, TERMS, modulus)
    assert same_bytes(pool.add_masks(arrays, TERMS, modulus), alone)
    assert same_bytes(alone, reference(arrays, modulus))
    assert modulus == 1000 or pool._running  # the job went to the workers (rejection-drawn masks stay here)


def test_the_pool_keeps_working_across_jobs_and_after_it_was_closed(pool):
    first = pool.add_masks(encoded(1), TERMS, 2**32)
    pool.close()
    assert same_bytes(pool.add_masks(encoded(1), TERMS, 2**32), first)
    assert same_bytes(first, reference(encoded(1), 2**32))


def test_negative_and_large_integers_are_taken_mod_the_modulus(pool):
    arrays = [np.array([-1, -(2**40), 2**40 + 3]), np.array([[2**33, 7]])]
    shapes = [(3,), (1, 2)]
    got = pool.add_masks(arrays, [(TERMS[0][0], 1), (TERMS[1][0], 1)], 2**32)
    masks = [sum(pair) for pair in zip(expand_mask(TERMS[0][0], 2**32, shapes), expand_mask(TERMS[1][0], 2**32, shapes))]
    assert same_bytes(got, [np.mod(a + m, 2**32) for a, m in zip(arrays, masks)])


def test_a_seed_too_short_is_refused_before_any_worker_sees_it_and_the_workers_serve_on(pool):
    with pytest.raises(ValueError, match="at least 16 bytes"):
        pool.add_masks(encoded(), [*TERMS, (b"rebuilt badly", 1)], 2**32)
    assert pool.pays(10**9, 9) and same_bytes(pool.add_masks(encoded(), TERMS, 2**32), reference(encoded(), 2**32))


def test_small_jobs_stay_in_process_and_large_ones_go_to_the_workers():
    pool = MaskPool(4, min_words=1000)
    assert not pool.pays(999, 1) and not pool.pays(499, 2) and not pool.pays(0, 2000)
    assert pool.pays(500, 2) and pool.pays(1000, 1) and pool.pays(10**6, 9)
    assert not MaskPool(1, min_words=0).pays(10**6, 9)  # one worker gains nothing


def test_the_pool_size_follows_the_environment(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "3")
    assert default_workers() == 3 and MaskPool().workers == 3
    monkeypatch.setenv(WORKERS_ENV, "many")
    with pytest.raises(ValueError, match=WORKERS_ENV):
        default_workers()
    monkeypatch.delenv(WORKERS_ENV)
    assert default_workers() == len(os.sched_getaffinity(0))


def masked_in_child(pool: MaskPool | None, queue) -> None:
    """In a child process: the masked integers, with ``pool`` or a fresh one that takes every job."""
    pool = pool or MaskPool(2, min_words=0)
    try:
        queue.put(b"".join(a.tobytes() for a in pool.add_masks(encoded(), TERMS, 2**32)))
    finally:
        pool.close()  # a child leaves by os._exit: no atexit


def expected_bytes() -> bytes:
    return b"".join(a.tobytes() for a in reference(encoded(), 2**32))


def test_a_machine_where_no_worker_can_start_masks_in_process_with_the_same_result(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    pool = MaskPool(2, min_words=0)
    assert same_bytes(pool.add_masks(encoded(), TERMS, 2**32), reference(encoded(), 2**32))
    assert not pool.pays(10**9, 9)  # it does not try again


def test_a_worker_that_died_leaves_the_job_to_this_process_with_the_same_result():
    pool = MaskPool(2, min_words=0)
    pool.add_masks(encoded(), TERMS, 2**32)
    victim = pool._running[0].process
    victim.kill()
    victim.wait()
    assert same_bytes(pool.add_masks(encoded(), TERMS, 2**32), reference(encoded(), 2**32))
    assert not pool._running  # the other worker was stopped too


def test_a_forked_child_of_a_process_with_running_workers_masks_with_its_own(pool):
    pool.add_masks(encoded(), TERMS, 2**32)  # the parent's workers are up
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=masked_in_child, args=(pool, queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert got == expected_bytes() and child.exitcode == 0
    assert same_bytes(pool.add_masks(encoded(), TERMS, 2**32), reference(encoded(), 2**32))  # the parent's still work


SCRIPT = """
import os, numpy as np
from privfed.secagg.mask_pool import shared_pool
print("script ran", flush=True)
pool = shared_pool()
pool.workers, pool.min_words = 2, 0
out = pool.add_masks([np.arange(4096)], [(os.urandom(32), 1), (os.urandom(32), -1)], 2**32)
print(out[0].size, len(pool._running))
"""


def test_a_script_without_a_main_guard_runs_once_exits_promptly_and_leaks_no_shared_memory(tmp_path):
    """The workers never import the caller's main script (multiprocessing's spawn would run it again in each)."""
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT)
    before = set(os.listdir("/dev/shm"))
    env = {**os.environ, "PYTHONPATH": str(Path(privfed.__file__).parents[1])}  # this checkout's privfed
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.split("\n")[:2] == ["script ran", "4096 2"]
    assert done.stderr == ""  # no leaked-segment warning from a resource tracker, no traceback at exit
    assert not {name for name in set(os.listdir("/dev/shm")) - before if name.startswith("psm_")}


def masked_in_ray_worker(arrays: list[np.ndarray], terms: list[tuple[bytes, int]]) -> tuple[bytes, bool]:
    pool = MaskPool(2, min_words=0)
    try:
        return b"".join(a.tobytes() for a in pool.add_masks(arrays, terms, 2**32)), bool(pool._running)
    finally:
        pool.close()


@pytest.mark.slow  # starts Ray
def test_a_ray_worker_masks_with_its_own_workers_to_the_same_bytes():
    ray = pytest.importorskip("ray")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the worker cannot import this test module
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        got, used = ray.get(ray.remote(masked_in_ray_worker).remote(encoded(), TERMS))
    finally:
        ray.shutdown()
    assert used and got == expected_bytes()
