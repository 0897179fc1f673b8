"""Standard streams that stop printing, not the command, when they cannot be written.

``privfed train ... | head -1`` closes the pipe after one line, a log on a full disk refuses more: either could kill
a run between two files. Behind :func:`forgiving_streams`, a stream's first failed write or flush points it at
``/dev/null`` and the command goes on.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class ForgivingStream:
    """A text stream that turns itself off at its first failed write instead of raising; the rest is the wrapped one."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_by_reader = False  # True once a write failed: nothing more is printed

    def write(self, text: str) -> int:
        if self.closed_by_reader:
            return len(text)
        try:
            return self._stream.write(text)  # a TypeError (bytes: click probes with b"") is the caller's
        except (OSError, ValueError):  # ValueError: the stream object was closed
            self._turn_off()
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.closed_by_reader:
            return
        try:
            self._stream.flush()
        except (OSError, ValueError):
            self._turn_off()

    def _turn_off(self) -> None:
        """Stops printing; the descriptor gets ``/dev/null``, so the buffer and any writer bypassing this object (a C
        library, a child process) drain there."""
        self.closed_by_reader = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def forgiving_streams() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` wrapped in :class:`ForgivingStream` while the block runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ForgivingStream(saved[0]), ForgivingStream(saved[1])
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved
