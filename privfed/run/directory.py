"""The run directory: what a training run leaves behind (docs/usage.md's table), and reading it back."""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from privfed.config import RUN_ID_KEY, TrainConfig, load_saved_config, read_json_object, read_text
from privfed.durable import append_line, locked, make_folder, save_torch, write_json, write_whole
from privfed.errors import PrivfedError
from privfed.methods import build_network
from privfed.models.network import OrchestraNetwork

CHECKPOINT_NAMES = ("initial", "final")


def default_run_dir(config: TrainConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # A method that releases nothing uses no mechanism, so the name leaves it out.
    releases = "" if config.release_mechanism is None else f"-{config.release_mechanism}"
    return Path("runs") / f"{stamp}-{config.method}{releases}-seed{config.seed}"


#: Held by the process that trains or resumes a run (:meth:`RunDirectory.claimed`).
LOCK_FILE = "run.lock"
#: Held while a result is appended to ``evaluation.json`` (:meth:`RunDirectory.append_evaluation`).
EVALUATION_LOCK_FILE = "evaluation.lock"


class RunDirectory:
    """Writes and reads one run's files; every write is a whole, flushed file or line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def client_ledgers(self) -> Path:
        """Where simulated clients keep their own privacy ledgers (a deployed node uses its ``state-dir``)."""
        return self.path / "client-ledgers"

    @property
    def releases(self) -> Path:
        """Where ``--record-releases`` keeps each round's releases (:mod:`privfed.run.recording`)."""
        return self.path / "releases"

    @contextmanager
    def claimed(self) -> Iterator[None]:
        """Holds the directory's lock file while the block runs (or the process lives), so two privfed processes never
        write one run; PrivfedError when the directory does not exist or another process holds it."""
        if not self.path.is_dir():
            raise PrivfedError(f"{self.path} is not a directory")
        lock = self.path / LOCK_FILE
        try:  # never through a link: the lock is created in this folder or not at all
            handle = os.fdopen(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644), "a")
        except OSError as err:
            why = f"{lock} is a link; remove it" if lock.is_symlink() else f"cannot write in {self.path}: {err.strerror}"
            raise PrivfedError(why) from None
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PrivfedError(f"{self.path} is in use by another privfed process; wait for it to end") from None
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def check_writable(self, *names: str) -> None:
        """Refuses (PrivfedError), before a command computes a result, result files it could not write: a file beside
        each is created and removed for real, as a later write would be (permissions, a read-only mount, /proc)."""
        for name in names:
            path = self.path / name
            for taken in (path, path.with_name(f".{name}.tmp")):  # the file, and the one it is written whole through
                if taken.is_dir():
                    raise PrivfedError(f"cannot write {path}: a folder named {taken.name} is in the way")
            probe = path.with_name(f".{name}.{os.getpid()}.probe")  # its own name: a concurrent writer keeps its .tmp
            try:
                probe.open("a").close()
                probe.unlink()
            except OSError as err:
                raise PrivfedError(f"cannot write {path}: {err.strerror}") from None

    def append_evaluation(self, result: dict[str, Any]) -> None:
        """Appends one result to ``evaluation.json``, under a lock of its own so concurrent evaluations keep every entry."""
        with locked(self.path / EVALUATION_LOCK_FILE):
            self.write_json("evaluation.json", {"evaluations": [*self.evaluations(), result]})

    def evaluations(self) -> list[dict[str, Any]]:
        """The results ``evaluation.json`` holds (none without the file); PrivfedError when it holds none (``privfed
        evaluate`` checks this before it computes anything, so no result is lost to a broken file)."""
        if not (self.path / "evaluation.json").is_file():
            return []
        history = self.read_json("evaluation.json").get("evaluations")
        if not isinstance(history, list):
            raise PrivfedError(f"{self.path / 'evaluation.json'} holds no list of evaluations; move it away")
        return history

    def holds_a_run(self) -> bool:
        return (self.path / "config.json").is_file()

    def check_unused(self) -> None:
        """Refuses (PrivfedError) a folder a new run could mix with other files: a run's, or any file but a lock."""
        if self.holds_a_run():
            raise PrivfedError(f"{self.path} already holds a run; choose another --out")
        found = self._first_file()
        if found is not None:
            raise PrivfedError(
                f"{self.path} holds files but no privfed run ({found} is there, config.json is not); a new run "
                "writes only into a new or empty folder: choose another --out"
            )

    def _first_file(self) -> str | None:
        """Some file under the folder other than its lock file (a path relative to it; a link named like the lock
        counts), or None."""
        for folder, folders, names in os.walk(self.path):  # a link to a folder is not walked, but counts as a file
            for name in names + [name for name in folders if Path(folder, name).is_symlink()]:
                found = Path(folder, name).relative_to(self.path)
                if found != Path(LOCK_FILE) or Path(folder, name).is_symlink():
                    return str(found)
        return None

    def create(self, config: TrainConfig) -> None:
        """Starts a fresh run directory under a new random run id; never mixes two runs' files (:meth:`check_unused`)."""
        self.check_unused()
        make_folder(self.checkpoints)
        write_json(self.path / "config.json", {**config.to_dict(), RUN_ID_KEY: uuid.uuid4().hex})

    def config_record(self) -> dict[str, Any]:
        """``config.json`` as written, run id included: what a resume point binds."""
        return self.read_json("config.json")

    def update_config(self, config: TrainConfig) -> None:
        """Rewrites ``config.json`` for what a resume changed (its rounds, its runtime), keeping the run id and ``out``."""
        record = self.config_record()
        if self.config() != config.replace(out=record.get("out")):
            self.write_json("config.json", {**record, **config.to_dict(), "out": record.get("out")})

    def config(self) -> TrainConfig:
        """The run's recorded configuration; PrivfedError when there is none, or it cannot be read back."""
        path = self.path / "config.json"
        if not path.is_file():
            raise PrivfedError(f"{self.path} is not a privfed run directory (no config.json)")
        return load_saved_config(path)

    def append_metrics(self, record: dict[str, Any]) -> None:
        append_line(self.path / "metrics.jsonl", json.dumps(record))

    def forget_rounds_after(self, round_index: int) -> None:
        """Removes ``metrics.jsonl``'s lines of rounds after ``round_index`` (a resume replays them), the others kept as written."""
        records = self.metrics()
        if all(record["round"] <= round_index for record in records):
            return
        lines = [line for line in read_text(self.path / "metrics.jsonl").splitlines() if line.strip()]
        kept = [line for line, record in zip(lines, records) if record["round"] <= round_index]
        write_whole(self.path / "metrics.jsonl", lambda tmp: tmp.write_text("".join(f"{line}\n" for line in kept)))

    def metrics(self) -> list[dict[str, Any]]:
        """Every logged round, in order; PrivfedError naming a line that is no round's record (a cut or edited file)."""
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return []
        records = []
        for number, line in enumerate(read_text(path).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise PrivfedError(f"{path}, line {number}, is not valid JSON ({err.msg}); the file is damaged") from None
            if not isinstance(record, dict) or not isinstance(record.get("round"), int):
                raise PrivfedError(f"{path}, line {number}, is not a round's record; the file is damaged")
            records.append(record)
        return records

    def write_json(self, name: str, payload: dict[str, Any]) -> None:
        write_json(self.path / name, payload)

    def read_json(self, name: str) -> dict[str, Any]:
        """A JSON object the run wrote; PrivfedError naming the file when it cannot be read or is none."""
        return read_json_object(self.path / name)

    def save_checkpoint(
        self, name: str, network: OrchestraNetwork, centroids: torch.Tensor | None, round_index: int
    ) -> Path:
        payload = {
            "network": {k: v.detach().cpu() for k, v in network.state_dict().items()},
            "centroids": None if centroids is None else centroids.detach().cpu(),
            "round": round_index,
        }
        return save_torch(self.checkpoints / f"{name}.pt", payload)

    def checkpoint_path(self, which: str) -> Path:
        """``initial``/``final`` name a checkpoint of this run; anything else is a path."""
        path = self.checkpoints / f"{which}.pt" if which in CHECKPOINT_NAMES else Path(which)
        if not path.is_file():
            raise PrivfedError(f"checkpoint not found: {path}")
        return path


def load_network(config: TrainConfig, checkpoint: Path) -> OrchestraNetwork:
    """Rebuilds the run's network (GroupNorm if it trained with DP-SGD) and loads a checkpoint into it."""
    network = build_network(config)
    try:
        payload = torch.load(checkpoint, map_location="cpu", weights_only=True)
        network.load_state_dict(payload["network"])
    except Exception as err:  # a damaged or foreign file can make the unpickler raise anything
        why = err.strerror if isinstance(err, OSError) and err.strerror else "it is damaged or not a privfed checkpoint"
        raise PrivfedError(f"cannot load checkpoint {checkpoint}: {why}") from None
    return network
