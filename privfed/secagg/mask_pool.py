"""Adding SecAgg+ masks to a vector, across worker processes when that pays (docs/performance.md, "SecAgg+ masking on the CPU").

``cryptography``'s AES ran slower in threads than in sequence, so each
worker process adds every mask's words over its own slice of one vector in
shared memory (:func:`~privfed.secagg.masks.add_mask_words`); addition mod
2^32 is exact, so the bytes are the same with or without the pool.

The workers are fresh interpreters (:func:`serve`): torch and ``fork`` do not
mix, and ``multiprocessing``'s spawn would re-run the caller's main script. A
pool that breaks leaves the job to this process, with the same result.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from privfed.secagg.masks import WORD_MODULUS, WORDS_PER_BLOCK, add_mask_words, check_seed, expand_mask

logger = logging.getLogger(__name__)

#: Environment variable that sets the number of workers (0 or 1: always in-process); unset, one per usable core.
WORKERS_ENV = "PRIVFED_MASK_WORKERS"
#: Fewest keystream words (vector length x masks) a job needs to go to the pool: 32 MB of AES, about 5 ms on one
#: core; below, the pool's fixed costs eat the gain.
MIN_POOL_WORDS = 1 << 23

#: A mask to add: its seed, and +1 (added) or -1 (taken off).
Term = tuple[bytes, int]


def default_workers() -> int:
    """The pool size: ``PRIVFED_MASK_WORKERS`` when set, else the cores this process may run on."""
    text = os.environ.get(WORKERS_ENV, "").strip()
    if text:
        if not text.isdigit():
            raise ValueError(f"{WORKERS_ENV} must be a whole number of workers, got {text!r}")
        return int(text)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class MaskPool:
    """Worker processes that add masks to a vector; jobs too small for them run in the caller's process."""

    def __init__(self, workers: int | None = None, *, min_words: int = MIN_POOL_WORDS) -> None:
        self.workers = default_workers() if workers is None else workers
        self.min_words = min_words
        self._running: list[_Worker] = []
        self._broken = False
        self._owner = os.getpid()
        self._lock = threading.Lock()  # one job at a time in the workers; a concurrent job runs in its own thread

    def add_masks(self, arrays: Sequence[np.ndarray], terms: Sequence[Term], modulus: int) -> list[np.ndarray]:
        """``arrays`` (integers) plus each term's mask times its sign, mod ``modulus``: int64 arrays of their shapes.

        Only a power-of-two modulus up to 2^32 uses the pool: other masks, drawn by rejection, cannot be sliced.
        """
        if any(not np.issubdtype(np.asarray(a).dtype, np.integer) for a in arrays):
            raise ValueError("masks are added to integer arrays")
        for seed, _ in terms:
            check_seed(seed)  # here, so that a bad seed never looks like a failed worker
        shapes = [np.shape(a) for a in arrays]
        if modulus & (modulus - 1) or modulus > WORD_MODULUS:
            return _add_masks_int64(arrays, terms, modulus, shapes)
        size = sum(math.prod(shape) for shape in shapes)
        if self._owner != os.getpid():
            self._forget_after_fork()
        if self.pays(size, len(terms)) and self._lock.acquire(blocking=False):
            try:
                result = self._add_in_workers(arrays, terms, modulus, size)
            finally:
                self._lock.release()
            if result is not None:
                return result
        vector = _flatten(arrays, np.empty(size, dtype=np.uint32))
        add_mask_words(vector, terms)
        return _unflatten(vector, shapes, modulus)

    def pays(self, size: int, masks: int) -> bool:
        """Whether a job of ``masks`` masks over ``size`` words goes to the workers (see :data:`MIN_POOL_WORDS`)."""
        return not self._broken and self.workers > 1 and size > 0 and size * masks >= self.min_words

    def close(self) -> None:
        """Stops the workers (a later job that pays starts new ones)."""
        with self._lock:
            self._stop()

    def _forget_after_fork(self) -> None:
        """In a forked copy: the parent's workers are not ours to talk to."""
        for worker in self._running:
            worker.forget()
        self._running, self._owner, self._lock = [], os.getpid(), threading.Lock()

    def _add_in_workers(
        self, arrays: Sequence[np.ndarray], terms: Sequence[Term], modulus: int, size: int
    ) -> list[np.ndarray] | None:
        """The job done by the workers in shared memory; None (and no workers from now on) if they failed."""
        shared = SharedMemory(create=True, size=4 * size)
        vector = np.ndarray((size,), dtype=np.uint32, buffer=shared.buf)
        try:
            _flatten(arrays, vector)
            try:  # each worker adds the masks over one slice, which starts on an AES block
                if not self._running:
                    self._running = [_Worker() for _ in range(self.workers)]
                step = -(-size // (len(self._running) * WORDS_PER_BLOCK)) * WORDS_PER_BLOCK
                busy = list(zip(self._running, range(0, size, step)))
                for worker, low in busy:
                    worker.send((shared.name, size, low, min(low + step, size), list(terms)))
                for worker, _ in busy:
                    worker.receive()
            except Exception as error:  # workers that cannot start, died or failed
                logger.warning("SecAgg+ masks are added in-process from now on: the mask workers failed (%r)", error)
                self._broken = True
                self._stop()
                return None
            return _unflatten(vector, [np.shape(a) for a in arrays], modulus)
        finally:
            del vector
            shared.close()
            shared.unlink()

    def _stop(self) -> None:
        running, self._running = self._running, []
        if self._owner == os.getpid():
            for worker in running:
                worker.stop()


class _Worker:
    """One worker process: reads pickled slice jobs on its stdin, answers each on its stdout (None: done)."""

    def __init__(self) -> None:
        # The worker looks modules up where this process does, so it runs this very copy of privfed.
        start = "import sys, json; sys.path[:] = json.loads(sys.argv[1]); from privfed.secagg.mask_pool import serve; serve()"
        self.process = subprocess.Popen(
            [sys.executable, "-c", start, json.dumps(sys.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def send(self, job: tuple[Any, ...]) -> None:
        assert self.process.stdin is not None
        pickle.dump(job, self.process.stdin)
        self.process.stdin.flush()

    def receive(self) -> None:
        assert self.process.stdout is not None
        error = pickle.load(self.process.stdout)  # EOFError if the worker died
        if error is not None:
            raise RuntimeError(f"a mask worker failed: {error}")

    def stop(self) -> None:
        """Closes the worker's input, which ends it; kills it if it does not end."""
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def forget(self) -> None:
        """In a forked child: drops this copy of the parent's pipes, leaving the worker to the parent."""
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()  # this process's copy of the pipe only
        self.process.returncode = 0  # not ours to wait for


def serve() -> None:
    """A worker's main: slice jobs from stdin until it closes, answers to stdout (anything printed goes to stderr)."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    while True:
        try:
            job = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        try:
            _add_slice(*job)
            reply = None
        except Exception as error:  # reported to the pool, which falls back to in-process
            reply = repr(error)
        pickle.dump(reply, replies)
        replies.flush()


def _add_slice(name: str, size: int, low: int, high: int, terms: list[Term]) -> None:
    """Adds the masks' words ``low`` to ``high`` to the shared vector ``name``."""
    shared = _attach(name)
    try:
        vector = np.ndarray((size,), dtype=np.uint32, buffer=shared.buf)
        add_mask_words(vector[low:high], terms, start=low)
        del vector
    finally:
        shared.close()


def _attach(name: str) -> SharedMemory:
    """The pool's shared vector, left to the pool to remove (Python < 3.13 would track it here too and warn)."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)
    shared = SharedMemory(name=name)
    resource_tracker.unregister(shared._name, "shared_memory")  # type: ignore[attr-defined]
    return shared


def _flatten(arrays: Sequence[np.ndarray], vector: np.ndarray) -> np.ndarray:
    """The arrays' entries mod 2^32, one after another, in ``vector``."""
    if arrays:
        np.concatenate([np.asarray(a).ravel() for a in arrays], out=vector, casting="unsafe")  # int -> uint32 wraps
    return vector


def _unflatten(vector: np.ndarray, shapes: Sequence[tuple[int, ...]], modulus: int) -> list[np.ndarray]:
    """The vector's entries mod ``modulus`` (which divides 2^32), as int64 arrays of ``shapes``."""
    if modulus < WORD_MODULUS:
        np.bitwise_and(vector, np.uint32(modulus - 1), out=vector)
    arrays, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        arrays.append(vector[start : start + size].astype(np.int64).reshape(shape))
        start += size
    return arrays


def _add_masks_int64(
    arrays: Sequence[np.ndarray], terms: Sequence[Term], modulus: int, shapes: Sequence[tuple[int, ...]]
) -> list[np.ndarray]:
    """The same sum in int64 from :func:`expand_mask`: exact while the masks' count times the modulus stays below 2^63."""
    total = [np.asarray(a).astype(np.int64) for a in arrays]
    for seed, sign in terms:
        for array, mask in zip(total, expand_mask(seed, modulus, shapes)):
            if sign > 0:
                array += mask
            else:
                array -= mask
    return [np.mod(array, modulus) for array in total]


_shared: MaskPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> MaskPool:
    """The process's pool (made on first use, stopped at exit; a forked child makes its own)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = MaskPool()
        return _shared


def _close_shared() -> None:
    if _shared is not None:
        _shared.close()


def _forget_shared_after_fork() -> None:
    """A forked child starts without the parent's pool (and without a lock another thread may have held)."""
    global _shared, _shared_lock
    if _shared is not None:
        _shared._forget_after_fork()
    _shared, _shared_lock = None, threading.Lock()


atexit.register(_close_shared)
os.register_at_fork(after_in_child=_forget_shared_after_fork)
