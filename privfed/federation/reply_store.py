"""A client's copy of its last reply, so that a replayed round gets the same message and nothing new.

A resumed run sends the interrupted round again; a second answer would
release new information (another release, a second SecAgg+ sum to
difference). So a client sends its stored reply (one file next to its
ledger) again for the same round of the same run with the same instructions,
charged once. A round recorded as *begun* (as the guard charges it) but never
answered was killed while computing: nothing of it left the node (a reply is
stored before it is returned), so it may be computed again without a second charge.

Under SecAgg+ the replay is masked with fresh keys; with the same cohort the
sum is the interrupted round's. ``docs/privacy.md`` says what a server that
replays a round with a *different* cohort could learn.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import Code, FitIns, FitRes, Parameters, Status

from privfed.durable import locked, write_whole

#: How the header of a stored reply is laid out (a file of another version is ignored).
FORMAT = 1
#: A client's stored reply, next to its ledger (``{}``: the partition).
REPLY_FILE = "privfed-reply-partition-{}.npz"


def reply_file(folder: Path, partition: int) -> Path:
    return folder / REPLY_FILE.format(partition)


def stored_round(path: Path) -> int | None:
    """The round a stored reply (or a begun record) is for, reading its header only (None: unreadable)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return int(json.loads(data["header"].tobytes().decode())["round"])
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
        return None


def forget_replies(folder: Path, before: int | None = None) -> None:
    """Removes the clients' stored replies in ``folder`` for rounds before ``before`` (None: every one).

    For a simulation, whose clients keep model-sized replies in the run
    directory: a resume replays only the round after its resume point, so a
    reply is useless once a later round has been logged, and every reply
    once the run has its summary.
    """
    for path in folder.glob(REPLY_FILE.format("*")):
        if before is None or (stored_round(path) or 0) < before:
            path.unlink(missing_ok=True)
    for leftover in folder.glob(REPLY_FILE.format("*") + ".tmp"):  # a write a kill interrupted
        leftover.unlink(missing_ok=True)


class _ArraysDigest:
    """The sha256 state after the model's arrays, kept for the last arrays hashed (the very same objects).

    On the local runtime every node of a round receives the same immutable
    ``bytes`` objects, so hashing them again per client (ResNet-18: 0.1 s) is
    waste. Only identity counts, and the arrays are held here so that their
    ids cannot pass to other objects: a hit is the same content by construction.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tensors: list[bytes] = []
        self._state: Any = None

    def after(self, tensors: list[bytes]) -> Any:
        """A fresh copy of the hash state after ``tensors`` (each preceded by its length), for the caller to extend."""
        with self._lock:
            same = len(tensors) == len(self._tensors) and all(a is b for a, b in zip(tensors, self._tensors))
            if self._state is None or not same:
                digest = hashlib.sha256()
                for tensor in tensors:
                    digest.update(len(tensor).to_bytes(8, "little"))
                    digest.update(tensor)
                if not all(type(t) is bytes for t in tensors):  # a mutable buffer is never taken as unchanged
                    self._tensors, self._state = [], None
                    return digest
                self._tensors, self._state = list(tensors), digest
            return self._state.copy()


_LAST_ARRAYS = _ArraysDigest()


def instructions_digest(ins: FitIns) -> str:
    """A digest of everything the server sent for a round: the model's arrays and the whole configuration."""
    digest = _LAST_ARRAYS.after(ins.parameters.tensors)
    for key in sorted(ins.config):
        value = ins.config[key]
        raw = value if isinstance(value, bytes) else repr(value).encode()
        digest.update(f"{key}:{type(value).__name__}:{len(raw)}:".encode())
        digest.update(raw)
    return digest.hexdigest()


@dataclass(frozen=True)
class StoredReply:
    """What the store holds for one round: the instructions' digest and the reply (None: begun, not answered).

    ``failed``: the charged round's computation failed; the same instructions
    get the same failure, never a retry (a failure can depend on the data or
    the noise, and each retry would show the server one more bit of it).
    """

    run: int
    round: int
    digest: str
    reply: FitRes | None
    failed: bool = False


class ReplyStore:
    """The last round a client began or answered, in ``path`` (None: in this process's memory only).

    Only the latest round is kept: the guard never answers an earlier one in a
    run that charges something (one that charges nothing computes it again).
    Writes replace the file whole, so a kill mid-write leaves the previous content.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._memory: StoredReply | None = None

    @contextlib.contextmanager
    def computing(self, run: int, round_index: int, digest: str) -> Iterator[None]:
        """Holds the partition's computation lock while a message is answered; records a charged round that failed.

        Flower may start a second ClientApp process for a message while the
        first computes (or two nodes share a state-dir): without the lock it
        would take the round, begun and unanswered, for killed and compute a
        second release for one charge.
        An error after the charge marks the round failed, so asking again
        never redraws noise.
        """
        with locked(None if self.path is None else self.path.with_name(self.path.name + ".lock")):
            try:
                yield
            except Exception:  # not a Ctrl-C: like a kill, it leaves the round to be computed again
                stored = self.get(run, round_index)
                if stored is not None and stored.reply is None and not stored.failed and stored.digest == digest:
                    self.fail(run, round_index, digest)
                raise

    def begin(self, run: int, round_index: int, digest: str) -> None:
        """Records that the client starts computing this round (as the guard charges it)."""
        self._write(StoredReply(run, round_index, digest, None))

    def fail(self, run: int, round_index: int, digest: str) -> None:
        """Records that this charged round's computation failed (see :class:`StoredReply`)."""
        self._write(StoredReply(run, round_index, digest, None, failed=True))

    def answer(self, run: int, round_index: int, digest: str, reply: FitRes) -> None:
        """Keeps the reply; called before the reply is returned, so a reply that left the node is always stored."""
        self._write(StoredReply(run, round_index, digest, reply))

    def get(self, run: int, round_index: int) -> StoredReply | None:
        """What is stored for this round of this run (None: nothing, or an unreadable file)."""
        stored = self._read(run, round_index)
        if stored is None or stored.run != run or stored.round != round_index:
            return None
        return stored

    def _write(self, stored: StoredReply) -> None:
        if self.path is None:
            self._memory = stored
            return
        header: dict[str, Any] = {
            "format": FORMAT, "run": stored.run, "round": stored.round, "digest": stored.digest, "failed": stored.failed,
        }
        arrays: dict[str, np.ndarray] = {}
        if stored.reply is not None:
            res = stored.reply
            header.update(
                num_examples=res.num_examples,
                tensor_type=res.parameters.tensor_type,
                status=[int(res.status.code.value), res.status.message],
                metrics={key: _encode_value(value) for key, value in res.metrics.items()},
                tensors=len(res.parameters.tensors),
            )
            arrays = {f"tensor_{i}": np.frombuffer(t, dtype=np.uint8) for i, t in enumerate(res.parameters.tensors)}
        encoded = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as file:  # straight to the file: a model-sized reply is not copied in memory first
                # numpy's stub checks **arrays against savez's allow_pickle keyword too; the keys are tensor_<i>.
                np.savez(file, header=encoded, **arrays)  # type: ignore[arg-type]

        write_whole(self.path, write, tmp=self.path.with_name(self.path.name + ".tmp"))

    def _read(self, run: int, round_index: int) -> StoredReply | None:
        """The stored round; its reply's arrays are read only when it is round ``round_index`` of ``run``."""
        if self.path is None:
            return self._memory
        if not self.path.is_file():
            return None
        try:
            with np.load(self.path, allow_pickle=False) as data:
                header = json.loads(data["header"].tobytes().decode())
                if header.get("format") != FORMAT:
                    return None
                reply = None
                if "tensors" in header and header["run"] == run and header["round"] == round_index:
                    tensors = [data[f"tensor_{i}"].tobytes() for i in range(int(header["tensors"]))]
                    code, message = header["status"]
                    reply = FitRes(
                        status=Status(code=Code(code), message=message),
                        parameters=Parameters(tensors=tensors, tensor_type=header["tensor_type"]),
                        num_examples=int(header["num_examples"]),
                        metrics={key: _decode_value(value) for key, value in header["metrics"].items()},
                    )
                failed = bool(header.get("failed", False))
                return StoredReply(int(header["run"]), int(header["round"]), str(header["digest"]), reply, failed)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
            return None  # unreadable: treated as nothing stored, so the round is refused, never answered twice


def _encode_value(value: Any) -> list[Any]:
    """A metric value as JSON, keeping its type (bytes travel as base64)."""
    if isinstance(value, bytes):
        return ["bytes", base64.b64encode(value).decode()]
    if isinstance(value, (bool, int, float, str)):
        return [type(value).__name__, value]
    raise TypeError(f"cannot store a metric of type {type(value).__name__}")


def _decode_value(encoded: list[Any]) -> Any:
    kind, value = encoded
    if kind == "bytes":
        return base64.b64decode(value)
    return {"bool": bool, "int": int, "float": float, "str": str}[kind](value)
