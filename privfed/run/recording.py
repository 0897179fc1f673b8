"""What a semi-honest server keeps of a run (``--record-releases``): ``RUN_DIR/releases/round-XXXX.pt``, what the
server had in that round, nothing more of a client's data (docs/attacks.md, "What is recorded")."""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mechanisms.base import Release
from privfed.durable import save_torch
from privfed.errors import PrivfedError
from privfed.orchestra.model_state import StateDict, apply_delta

_ROUND_FILE = re.compile(r"round-(\d{4,})\.pt")


@dataclass(frozen=True)
class RecordedRelease:
    """One client's release as the server decoded it: ``[m, D]`` vectors, the ``[m]`` weights it claims for them,
    and its :class:`mechanisms.base.Guarantee` as a dict."""

    client: int
    vectors: torch.Tensor
    weights: torch.Tensor
    guarantee: dict[str, Any]


@dataclass(frozen=True)
class RecordedSecureSum:
    """What the server decoded from a secure-sum mechanism's sum (:meth:`mechanisms.base.SecureSumMechanism.decode`):
    ``[C, D]`` vectors, their ``[C]`` weights, and the clients whose shares it holds (ascending)."""

    vectors: torch.Tensor
    weights: torch.Tensor
    clients: tuple[int, ...]


@dataclass(frozen=True)
class RecordedRound:
    """Everything the server sent (the state every client started from, the ``[G, D]`` centroids: None in round 0
    and for methods without) and received in one round: one release per reply, in client order; each client's
    model delta where the server saw it in the clear (``updates``; None under SecAgg+, in round 0, and in files
    written before it was kept); a secure-sum mechanism's decoded sum (``secure_sum``; None otherwise, when the
    sum halted, and in older files)."""

    round: int
    model_state: StateDict
    centroids: torch.Tensor | None
    mechanism: str
    mechanism_params: dict[str, Any]
    releases: tuple[RecordedRelease, ...]
    updates: dict[int, StateDict] | None = None
    secure_sum: RecordedSecureSum | None = None

    @staticmethod
    def of(
        round_index: int,
        *,
        model_state: StateDict,
        centroids: torch.Tensor | None,
        mechanism: str,
        mechanism_params: dict[str, Any],
        releases: list[tuple[int, Release]],
        updates: dict[int, StateDict] | None = None,
        secure_sum: RecordedSecureSum | None = None,
    ) -> RecordedRound:
        """Keeps what the server received of each release (not its metrics or events, which the ledger holds), and
        the updates as float32 on the CPU (the tensors themselves where they are so already: no model-sized copies)."""
        return RecordedRound(
            round=round_index,
            model_state={k: v.detach().cpu().clone() for k, v in model_state.items()},
            centroids=None if centroids is None else centroids.detach().cpu().clone(),
            mechanism=mechanism,
            mechanism_params=dict(mechanism_params),
            releases=tuple(
                RecordedRelease(client, r.vectors.detach().cpu().float(), r.weights.detach().cpu().float(), r.guarantee.to_dict())
                for client, r in releases
            ),
            updates=None if updates is None else {
                int(client): {k: v.detach().to("cpu", torch.float32) for k, v in delta.items()}
                for client, delta in updates.items()
            },
            secure_sum=secure_sum,
        )


def client_state(recorded: RecordedRound, client: int) -> StateDict | None:
    """The state ``client`` ended its round with: the state it started from plus its delta (None: its update was
    not recorded, e.g. under SecAgg+ or in round 0)."""
    if recorded.updates is None or client not in recorded.updates:
        return None
    return apply_delta(recorded.model_state, recorded.updates[client])


def round_path(directory: Path, round_index: int) -> Path:
    return Path(directory) / f"round-{round_index:04d}.pt"


def write_round(directory: Path, recorded: RecordedRound) -> Path:
    """Writes one round's file whole."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    summed = recorded.secure_sum
    payload = {
        **vars(recorded),
        "releases": [vars(r) for r in recorded.releases],
        "secure_sum": None if summed is None else {**vars(summed), "clients": list(summed.clients)},
    }
    return save_torch(round_path(directory, recorded.round), payload)


def recorded_rounds(directory: Path) -> list[int]:
    """The rounds recorded in ``directory``, ascending (empty if there is none)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = (_ROUND_FILE.fullmatch(p.name) for p in directory.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def read_round(directory: Path, round_index: int) -> RecordedRound:
    """One round, read back; PrivfedError when it was not recorded, or its file is unreadable."""
    path = round_path(directory, round_index)
    if not path.is_file():
        raise PrivfedError(f"round {round_index} was not recorded (no {path})")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        return RecordedRound(
            round=int(payload["round"]),
            model_state=payload["model_state"],
            centroids=payload["centroids"],
            mechanism=str(payload["mechanism"]),
            mechanism_params=dict(payload["mechanism_params"]),
            releases=tuple(
                RecordedRelease(int(r["client"]), r["vectors"], r["weights"], dict(r["guarantee"]))
                for r in payload["releases"]
            ),
            updates=_updates(payload.get("updates")),
            secure_sum=_secure_sum(payload.get("secure_sum")),
        )
    except (RuntimeError, KeyError, OSError, TypeError, ValueError, pickle.UnpicklingError) as err:
        raise PrivfedError(f"cannot read recorded round {path}: {str(err).splitlines()[0]}") from None


def _updates(stored: dict[int, StateDict] | None) -> dict[int, StateDict] | None:
    return None if stored is None else {int(client): dict(delta) for client, delta in stored.items()}


def _secure_sum(stored: dict[str, Any] | None) -> RecordedSecureSum | None:
    if stored is None:
        return None
    return RecordedSecureSum(stored["vectors"], stored["weights"], tuple(int(c) for c in stored["clients"]))
