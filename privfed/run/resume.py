"""Resumable runs: what the server saves to continue a run, and the rules for continuing one (docs/flower.md, "Resuming a run").

The ledger is not copied into ``checkpoints/resume.pt``: ``ledger.jsonl``
holds every charge before the round ends, and charges of rounds redone after
a kill stay there, since those releases did reach the server.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from privfed.config import TrainConfig, read_text
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
        round: The last finished Orchestra round.
        network: The global network's full state dict.
        centroids: The global centroids (None for a method without them).
        initialised: Whether round 0 has been applied.
        server_generator: The server's clustering generator state.
        runtime: The FL runtime's own state (client sampling, SecAgg+ scales), opaque here.
        driver: The driver's running figures (untrained kNN, last kNN and loss, elapsed seconds).
    """

    round: int
    network: dict[str, torch.Tensor]
    centroids: torch.Tensor | None
    initialised: bool
    server_generator: torch.Tensor
    runtime: dict[str, Any]
    driver: dict[str, Any]


def write_resume_point(run_dir: RunDirectory, point: ResumePoint) -> Path:
    """Replaces the run's resume point whole (a crash mid-write leaves the previous one)."""
    return save_torch(run_dir.checkpoints / RESUME_FILE, dataclasses.asdict(point))


def read_resume_point(run_dir: RunDirectory) -> ResumePoint:
    """The run's resume point.

    Raises:
        PrivfedError: when the run has none, or it cannot be read.
    """
    path = run_dir.checkpoints / RESUME_FILE
    if not path.is_file():
        raise PrivfedError(
            f"{run_dir.path} has no resume point ({path}): it stopped before its first checkpoint, so nothing can be "
            "resumed; start it again with another --out (or delete this folder)"
        )
    try:
        return ResumePoint(**torch.load(path, map_location="cpu", weights_only=True))
    except Exception as err:  # a damaged file can make the unpickler raise anything
        why = err.strerror if isinstance(err, OSError) and err.strerror else "it is damaged or not a resume point"
        raise PrivfedError(f"cannot read {path}: {why}") from None


def resumed_config(run_dir: RunDirectory, overrides: dict[str, Any]) -> TrainConfig:
    """The recorded configuration with the changes a resume allows.

    Raises:
        PrivfedError: for any other change, or fewer rounds than already finished.
    """
    recorded = run_dir.config()
    changed = {name: value for name, value in overrides.items() if value is not None and value != getattr(recorded, name)}
    refused = sorted(set(changed) - set(CHANGEABLE_ON_RESUME))
    if refused:
        raise PrivfedError(
            f"--resume continues the recorded run; it cannot change {', '.join(refused)} "
            f"(only {', '.join(CHANGEABLE_ON_RESUME)} may change)"
        )
    return recorded.replace(**changed)


def check_resumable(run_dir: RunDirectory, point: ResumePoint, config: TrainConfig) -> None:
    """Refuses a run that is already complete or out of budget, a resume that would end before its resume point, a point
    ahead of the run's own log (one copied from another run would skip rounds the ledger never charged), or
    one behind it (redoing logged rounds would release twice what the ledger charged once). Charges for the one
    round after the point that the log does not hold yet are accepted: a kill came between them and the log."""
    logged = [m["round"] for m in run_dir.metrics()]
    if not logged or point.round > max(logged):
        raise PrivfedError(
            f"{run_dir.path}'s resume point is at round {point.round}, but its metrics.jsonl ends at "
            f"{max(logged) if logged else 'no round'}: the point is not this run's"
        )
    charged = [entry.round for entry in _ledger_entries(run_dir.path / "ledger.jsonl")]
    # A kill between the ledger's charges for the next round and its metrics line leaves that round charged
    # but unlogged; replaying it charges nothing twice (the ledger keeps one charge per client and round).
    replayable = {point.round + 1} if max(logged) == point.round else set()
    later = sorted({r for r in logged + charged if r > point.round} - replayable)
    if later:
        raise PrivfedError(
            f"{run_dir.path} ran round {later[0]}{f' to {later[-1]}' if len(later) > 1 else ''} after its last resume "
            f"point (round {point.round}); those releases were made and clients answer a round only once, so it "
            "cannot go on from there (--checkpoint-every 1 keeps the point at the last finished round)"
        )
    summary = run_dir.path / "summary.json"
    if summary.is_file() and stop_cause(run_dir.read_json(summary.name)) == BUDGET:
        raise PrivfedError(f"{run_dir.path} stopped because its privacy budget ran out; it cannot go on")
    if config.rounds <= point.round:
        raise PrivfedError(
            f"{run_dir.path} already finished round {point.round} of {config.rounds}; "
            "resume with more --rounds to go on"
        )


def _ledger_entries(path: Path) -> list[LedgerEntry]:
    """The server's ledger, read whole before a resume relies on it.

    Raises:
        PrivfedError: naming the line that is not a ledger entry: the budget already spent is then unknown.
    """
    if not path.is_file():
        return []
    entries = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        try:
            entries.append(LedgerEntry.from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise PrivfedError(
                f"{path}, line {number}, is not a ledger entry; the budget already spent is unknown, so the run "
                "cannot go on"
            ) from None
    return entries
