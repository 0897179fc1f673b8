"""Ctrl-C for a training run: the first asks it to stop after the current round, the second stops it now (docs/flower.md, "Stopping a run").

The second ends the process (``os._exit``, after ``on_exit_now``): raising would leave Flower's ServerApp thread
waiting for replies. Only the command line installs these handlers (:func:`signals_stop_runs`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

#: The signals a run stops on.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_signals_wanted = False


class StopRequest:
    """Set once, from a signal handler or another thread; read by the driver when a round ends."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()


@contextmanager
def stop_on_signals(on_exit_now: Callable[[], None] | None = None) -> Iterator[StopRequest]:
    """Handles SIGINT/SIGTERM inside the block; the previous handlers come back after it.

    Enter it after anything that installs its own (Ray's driver aborts on SIGTERM once ``ray.init`` ran). Outside
    the main thread the handlers stay as they are, and the request is only ever set by hand.
    """
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop.requested:
            print(f"\n{name} again: stopping now", file=sys.stderr, flush=True)
            try:
                if on_exit_now is not None:
                    on_exit_now()
            finally:
                os._exit(128 + signum)
        stop.request(f"interrupted by {name}")
        print(f"\n{name}: stopping after the current round (again to stop at once)", file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, handle) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def signals_stop_runs() -> Iterator[None]:
    """Lets the runs started inside the block stop on SIGINT/SIGTERM (:func:`run_stop_request`); the CLI asks for it.
    By default a run installs none: a library call must not replace its process's (a notebook's, a scheduler's)."""
    global _signals_wanted
    before, _signals_wanted = _signals_wanted, True
    try:
        yield
    finally:
        _signals_wanted = before


@contextmanager
def run_stop_request(on_exit_now: Callable[[], None] | None = None) -> Iterator[StopRequest]:
    """A run's :class:`StopRequest`: set by Ctrl-C inside :func:`signals_stop_runs`, otherwise only by hand."""
    if not _signals_wanted:
        yield StopRequest()
        return
    with stop_on_signals(on_exit_now=on_exit_now) as stop:
        yield stop
