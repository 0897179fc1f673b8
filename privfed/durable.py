"""Files that survive a kill and a machine crash (whole, on disk, under their name), and one writer at a time."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from privfed.errors import PrivfedError

#: What a write fails with when the disk or the user's quota is full, or a file reached the size limit (ulimit -f).
FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: The longest file name and path Linux file systems take, in bytes (``NAME_MAX``, ``PATH_MAX``).
NAME_MAX, PATH_MAX = 255, 4096


def check_path(path: Path, what: str) -> None:
    """Refuses (PrivfedError) a path the system would refuse midway: a name over :data:`NAME_MAX` bytes, or the whole
    (with up to 100 bytes more for the files within) over :data:`PATH_MAX`."""
    length = len(os.fsencode(path.absolute()))
    if length + 100 > PATH_MAX:
        raise PrivfedError(f"{what} is too long: {length} bytes, and a path must stay under {PATH_MAX - 100}")
    longest = max(path.parts, key=lambda part: len(os.fsencode(part)), default="")
    if len(os.fsencode(longest)) > NAME_MAX:
        raise PrivfedError(
            f"{what} has a name of {len(os.fsencode(longest))} bytes ({longest[:40]}...); a name takes at most {NAME_MAX}"
        )


def sync_directory(folder: Path) -> None:
    """Flushes ``folder``'s entries, so a file created or renamed in it keeps its name after a crash (POSIX)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_folder(folder: Path) -> Path:
    """``folder`` and its missing parents, each new name flushed to disk; FileExistsError when a file is in the way."""
    for made in reversed([f for f in (folder, *folder.parents) if not f.exists()]):
        made.mkdir(exist_ok=True)
        sync_directory(made.parent)
    folder.mkdir(exist_ok=True)
    return folder


def make_directory(path: Path, *, kind: str) -> None:
    """Creates ``path``, or says in one line why it cannot (a file in the way, no permission)."""
    try:
        make_folder(path)  # its name on disk: a run's ledger is in it
    except FileExistsError:
        raise PrivfedError(f"cannot create the {kind} {path}: a file is in the way") from None
    except OSError as err:
        raise PrivfedError(f"cannot create the {kind} {path}: {err.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PrivfedError(f"cannot write in the {kind} {path}: permission denied")


def write_whole(path: Path, write: Callable[[Path], object], *, tmp: Path | None = None) -> Path:
    """``write`` into a temporary file (``tmp``; default ``.NAME.tmp``), flushed to disk and renamed over ``path``:
    never half a file, nor the old one back after a crash."""
    tmp = tmp or path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as file:
            os.fsync(file.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # on a full disk, the space it took back
        raise
    tmp.replace(path)
    sync_directory(path.parent)
    return path


def write_json(path: Path, values: dict[str, Any]) -> Path:
    """``values`` as indented JSON, written whole (:func:`write_whole`)."""
    return write_whole(path, lambda tmp: tmp.write_text(json.dumps(values, indent=2) + "\n"))


def save_torch(path: Path, payload: Any) -> Path:
    """``torch.save`` of ``payload``, written whole (:func:`write_whole`); serialised in memory first, so a full disk
    raises an OSError naming it (torch's own writer reports it as an unrelated RuntimeError)."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return write_whole(path, lambda tmp: tmp.write_bytes(buffer.getbuffer()))


def append_line(path: Path, line: str) -> None:
    """Appends ``line`` and flushes it to disk (and the file's name, when this created it); a line that cannot be
    written whole (a full disk) is cut off again, so the file keeps only whole lines."""
    created = not path.exists()
    data = (line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)
    if created:
        sync_directory(path.parent)


@contextlib.contextmanager
def locked(path: Path | None) -> Iterator[None]:
    """Holds an exclusive lock on the file ``path`` (made if missing) while the block runs; None: one process, no lock."""
    if path is None:
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            # Not left to the close: a process forked inside the block shares the lock, and would hold it on.
            fcntl.flock(lock, fcntl.LOCK_UN)
