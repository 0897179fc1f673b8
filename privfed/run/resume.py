"""Resumable runs: what the server saves to continue a run, and the rules for continuing one (docs/flower.md, "Resuming a run").

The ledger stays in ``ledger.jsonl`` (charges of rounds redone after a kill stay: those releases reached the
server). The point binds the folder: a copy of ``config.json`` (run id included) and, per ledger, its number of
entries and their SHA-256. A resume refuses a folder whose bound files were changed, cut, removed or replaced by a
link since: a careless or hand edit would otherwise resume under another configuration or with less ε spent than
was. It is a digest, not a signature: whoever rewrites ``resume.pt`` too can make any folder pass (docs/usage.md).

A run ended cleanly only when its point says so and ``summary.json`` is the
one it wrote then (:func:`ended_cleanly`); anything else reads as a kill,
whose round in progress charges its silent clients. A resume unmarks the
point before it deletes the summary, so a kill of the resumed run reads as one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from privfed.config import RUN_ID_KEY, TrainConfig, checked_options, read_legacy_settings
from privfed.durable import save_torch
from privfed.errors import PrivfedError
from privfed.privacy.ledger import LedgerEntry
from privfed.run.directory import RunDirectory
from privfed.run.stop import BUDGET, stop_cause

RESUME_FILE = "resume.pt"
#: Options a resumed run may change: more rounds (when the privacy calibration does not depend on them), and the
#: runtime that carries it (both give the same run).
CHANGEABLE_ON_RESUME = ("rounds", "runtime")


@dataclass(frozen=True)
class ResumePoint:
    """The server's state at the end of round ``round``.

    Attributes:
        runtime: The FL runtime's own state (client sampling, SecAgg+ scales), opaque here.
        driver: The driver's running figures (untrained kNN, last kNN and loss, elapsed seconds).
        config: ``config.json`` when :func:`write_resume_point` wrote the point.
        ledgers: Each ledger file's seal then, by path in the run folder.
        summary_sha256: ``summary.json``'s SHA-256 once the run ended here (:func:`mark_end`), else None.
        mechanism_params: The plan's mechanism parameters then (None: a point written before they were kept), so a
            resume whose installed mechanism plans otherwise (an unset setting's default moved) is refused.
    """

    round: int
    network: dict[str, torch.Tensor]
    centroids: torch.Tensor | None
    initialised: bool
    server_generator: torch.Tensor
    runtime: dict[str, Any]
    driver: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    ledgers: dict[str, dict[str, Any]] = field(default_factory=dict)
    summary_sha256: str | None = None
    mechanism_params: dict[str, Any] | None = None


#: The server's ledger, and where simulated clients keep theirs, in a run folder.
SERVER_LEDGER = "ledger.jsonl"


def ledger_names(run_dir: RunDirectory) -> list[str]:
    """The run's ledger files, as paths in its folder: the server's and each simulated client's."""
    server = run_dir.path / SERVER_LEDGER
    names = [SERVER_LEDGER] if server.is_file() or server.is_symlink() else []
    folder = run_dir.client_ledgers
    found = (path for path in folder.glob("*.jsonl") if path.is_file() or path.is_symlink())
    return names + sorted(f"{folder.name}/{path.name}" for path in found)


def _lines(data: bytes) -> list[bytes]:
    """A file's lines, each with its newline (the last one without, when cut short)."""
    lines = data.split(b"\n")
    return [line + b"\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def _seal(data: bytes) -> dict[str, Any]:
    """What a resume point keeps of a ledger: its whole lines' number and SHA-256."""
    whole = data[: data.rfind(b"\n") + 1]
    return {"entries": whole.count(b"\n"), "sha256": hashlib.sha256(whole).hexdigest()}


def write_resume_point(run_dir: RunDirectory, point: ResumePoint) -> Path:
    """Replaces the run's resume point whole (a crash mid-write leaves the previous one), bound to the folder's
    ``config.json`` and ledgers as they are now."""
    ledgers = {name: _seal(_read_bytes(run_dir.path / name)) for name in ledger_names(run_dir)}
    bound = dataclasses.replace(point, config=run_dir.config_record(), ledgers=ledgers)
    return save_torch(run_dir.checkpoints / RESUME_FILE, dataclasses.asdict(bound))


#: The file whose digest says a run ended at its resume point.
SUMMARY_FILE = "summary.json"


def mark_end(run_dir: RunDirectory, ended: bool) -> None:
    """Records in the run's resume point (if any) that the run ended there with its ``summary.json`` now, or, not
    ``ended``, that it goes on; the point's binding stays as written."""
    if not has_resume_point(run_dir):
        return
    digest = hashlib.sha256(_read_bytes(run_dir.path / SUMMARY_FILE)).hexdigest() if ended else None
    point = dataclasses.replace(read_resume_point(run_dir), summary_sha256=digest)
    save_torch(run_dir.checkpoints / RESUME_FILE, dataclasses.asdict(point))


def ended_cleanly(run_dir: RunDirectory, point: ResumePoint) -> bool:
    """Whether the run ended at ``point`` with the ``summary.json`` it has (else it was killed, or its summary is
    not the one it wrote)."""
    summary = run_dir.path / SUMMARY_FILE
    return (
        point.summary_sha256 is not None
        and summary.is_file()
        and hashlib.sha256(_read_bytes(summary)).hexdigest() == point.summary_sha256
    )


def has_resume_point(run_dir: RunDirectory) -> bool:
    return (run_dir.checkpoints / RESUME_FILE).is_file()


def read_resume_point(run_dir: RunDirectory) -> ResumePoint:
    """The run's resume point; PrivfedError when it has none, or it cannot be read."""
    path = run_dir.checkpoints / RESUME_FILE
    if not has_resume_point(run_dir):
        raise PrivfedError(
            f"{run_dir.path} has no resume point ({path}): it stopped before its first checkpoint, so nothing can be "
            "resumed; start it again with another --out (or delete this folder)"
        )
    try:
        point = ResumePoint(**torch.load(path, map_location="cpu", weights_only=True))
    except Exception as err:  # a damaged file can make the unpickler raise anything
        why = err.strerror if isinstance(err, OSError) and err.strerror else "it is damaged or not a resume point"
        raise PrivfedError(f"cannot read {path}: {why}") from None
    if not point.config:
        raise PrivfedError(
            f"{path} does not record the run's configuration and ledgers (an older privfed wrote it), so what the "
            "run already spent cannot be checked; start it again with another --out"
        )
    if not _well_formed(point):
        raise PrivfedError(f"cannot read {path}: it is damaged or not a resume point")
    return point


def _well_formed(point: ResumePoint) -> bool:
    """Whether the point's binding has the shape :func:`write_resume_point` gives it."""
    seals = point.ledgers.values() if isinstance(point.ledgers, dict) else [None]
    kept = isinstance(point.config, dict) and isinstance(point.mechanism_params, (dict, type(None)))
    return kept and isinstance(point.summary_sha256, (str, type(None))) and all(
        isinstance(seal, dict) and isinstance(seal.get("entries"), int) and isinstance(seal.get("sha256"), str)
        for seal in seals
    )


def point_config(run_dir: RunDirectory, point: ResumePoint) -> TrainConfig:
    """The configuration the resume point was written under, ``out`` the folder's own.

    Raises:
        PrivfedError: ``config.json`` carries another run id, or the point's copy is not a configuration.
    """
    recorded_id = run_dir.config_record().get(RUN_ID_KEY)
    if point.config.get(RUN_ID_KEY) != recorded_id:
        raise PrivfedError(
            f"{run_dir.path / 'checkpoints' / RESUME_FILE} belongs to another run (run id "
            f"{point.config.get(RUN_ID_KEY)}, config.json's is {recorded_id}): the point is not this run's"
        )
    values = read_legacy_settings({name: value for name, value in point.config.items() if name != RUN_ID_KEY})
    config = TrainConfig(**checked_options(values, source=str(run_dir.checkpoints / RESUME_FILE)))
    return config.replace(out=str(run_dir.path.resolve()))


def resumed_config(run_dir: RunDirectory, point: ResumePoint, overrides: dict[str, Any]) -> TrainConfig:
    """The configuration the point was written under, with the changes a resume allows (else PrivfedError).

    ``config.json`` may differ from it only as the command line may (a resume that raised ``--rounds`` rewrites it
    before its first resume point).
    """
    bound = point_config(run_dir, point)
    recorded = run_dir.config().replace(out=bound.out)
    edited = sorted(f.name for f in dataclasses.fields(TrainConfig) if getattr(recorded, f.name) != getattr(bound, f.name))
    refused = sorted(set(edited) - set(CHANGEABLE_ON_RESUME))
    if refused:
        raise PrivfedError(
            f"{run_dir.path / 'config.json'} was changed after the run's last resume point ({', '.join(refused)}); "
            f"a resume cannot change {', '.join(refused)} (only {', '.join(CHANGEABLE_ON_RESUME)} may change)"
        )
    changed = {name: value for name, value in overrides.items() if value is not None and value != getattr(recorded, name)}
    refused = sorted(set(changed) - set(CHANGEABLE_ON_RESUME))
    if refused:
        raise PrivfedError(
            f"--resume continues the recorded run; it cannot change {', '.join(refused)} "
            f"(only {', '.join(CHANGEABLE_ON_RESUME)} may change)"
        )
    return recorded.replace(**changed)


def check_resumable(run_dir: RunDirectory, point: ResumePoint, config: TrainConfig) -> None:
    """Refuses a run that ended after its last round or out of budget, a resume that would end before its resume point, a
    point ahead of the run's own log (one copied from another run would skip rounds the ledger never charged), ledgers
    that are not those the point recorded (:func:`entries_after_point`), or a run that went on past the point (redoing
    its rounds would release twice what the ledger charged once).

    The one round after the point may have begun before a kill: its charges, and its metrics line when the run was
    killed (a kill came before the point that would have followed), are accepted, and the round is replayed. A run
    killed after its last round's point (in its summary's writing) runs no round: the resume writes its summary.
    """
    logged = [m["round"] for m in run_dir.metrics()]
    if not logged or point.round > max(logged):
        raise PrivfedError(
            f"{run_dir.path}'s resume point is at round {point.round}, but its metrics.jsonl ends at "
            f"{max(logged) if logged else 'no round'}: the point is not this run's"
        )
    killed = not ended_cleanly(run_dir, point)
    charged = [entry.round for entries in entries_after_point(run_dir, point).values() for entry in entries]
    # A kill between the ledger's charges for the next round and its resume point leaves that round charged (and
    # perhaps logged) past the point; replaying it charges nothing twice (the ledger keeps one charge per client and
    # round) and its clients send their stored replies again.
    replayable = {point.round + 1} if max(logged) == point.round or (killed and max(logged) == point.round + 1) else set()
    later = sorted({r for r in logged + charged if r > point.round} - replayable)
    if later:
        raise PrivfedError(
            f"{run_dir.path} ran round {later[0]}{f' to {later[-1]}' if len(later) > 1 else ''} after its last resume "
            f"point (round {point.round}); those releases were made and clients answer a round only once, so it "
            "cannot go on from there (--checkpoint-every 1 keeps the point at the last finished round)"
        )
    # The point's word stands when summary.json is gone; any summary's word refuses too (refusing is never a risk).
    budget_stop = point.driver.get("stop_cause") == BUDGET
    if budget_stop or ((run_dir.path / SUMMARY_FILE).is_file() and stop_cause(run_dir.read_json(SUMMARY_FILE)) == BUDGET):
        raise PrivfedError(f"{run_dir.path} stopped because its privacy budget ran out; it cannot go on")
    if config.rounds < point.round or (config.rounds == point.round and not killed):
        raise PrivfedError(
            f"{run_dir.path} already finished round {point.round} of {config.rounds}; "
            "resume with more --rounds to go on"
        )


#: Why a resume stops at a ledger that is not the one its point recorded.
UNKNOWN_SPENT = "the budget already spent is unknown, so the run cannot go on"


def entries_after_point(run_dir: RunDirectory, point: ResumePoint) -> dict[Path, list[LedgerEntry]]:
    """Each ledger file's entries after those the resume point recorded (all of a client ledger it did not know).

    The server writes its point after the round's charges, so its own later entries can only be of the next round.
    A client's may also be of an earlier round it was admitted to late: that only adds to its own charges.

    Raises:
        PrivfedError: naming the file: a link (or in a linked folder), gone, shorter or changed in its recorded
            entries; a later line that is no entry; a later server charge of a round up to the point's.
    """
    for folder in (run_dir.client_ledgers, run_dir.checkpoints):
        if folder.is_symlink():  # what the run writes there would land outside its folder
            raise PrivfedError(f"{folder} is a link, not a folder of this run's own: {UNKNOWN_SPENT}")
    found: dict[Path, list[LedgerEntry]] = {}
    for name in sorted(set(ledger_names(run_dir)) | set(point.ledgers)):
        path = run_dir.path / name
        seal = point.ledgers.get(name, {"entries": 0, "sha256": _seal(b"")["sha256"]})
        if path.is_symlink():  # its charges would be appended outside the run folder
            raise PrivfedError(f"{path} is a link, not a ledger of this run's own: {UNKNOWN_SPENT}")
        if not path.is_file():
            raise PrivfedError(f"{path} is gone, but the resume point recorded {_entries(seal['entries'])} in it: {UNKNOWN_SPENT}")
        lines = _lines(_read_bytes(path))
        recorded = seal["entries"]
        if len(lines) < recorded:
            raise PrivfedError(
                f"{path} has {_entries(len(lines))}, the resume point recorded {recorded}: {UNKNOWN_SPENT}"
            )
        if hashlib.sha256(b"".join(lines[:recorded])).hexdigest() != seal["sha256"]:
            raise PrivfedError(
                f"{path}'s first {recorded} entries are not those the resume point recorded: {UNKNOWN_SPENT}"
            )
        entries = [_ledger_entry(path, number, line) for number, line in enumerate(lines[recorded:], start=recorded + 1)]
        early = [entry.round for entry in entries if entry.round <= point.round]
        if name == SERVER_LEDGER and early:
            raise PrivfedError(
                f"{path} charges round {early[0]} after the entries its resume point (round {point.round}) "
                f"recorded: {UNKNOWN_SPENT}"
            )
        found[path] = entries
    return found


def _entries(count: int) -> str:
    return f"{count} entr{'y' if count == 1 else 'ies'}"


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise PrivfedError(f"cannot read {path}: {err.strerror}") from None


def _ledger_entry(path: Path, number: int, line: bytes) -> LedgerEntry:
    """Line ``number`` of a ledger file as an entry; PrivfedError naming the line when it is none."""
    try:
        return LedgerEntry.from_dict(json.loads(line.decode("utf-8")))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise PrivfedError(f"{path}, line {number}, is not a ledger entry; {UNKNOWN_SPENT}") from None
