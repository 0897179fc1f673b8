"""What a node trusts in SecAgg+ against a deviating server: its identity, its pins, and the survivor sets it signed.

All of it comes from the node's own configuration, never from the server:
``secagg-identity`` and ``secagg-peers`` in its node config (deployment), or
the files a simulation writes into each node's state folder
(:func:`privfed.secagg.identity.write_simulated_identities`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

from flwr.app import ConfigRecord, Context

from privfed.durable import locked, make_folder, write_whole
from privfed.secagg.identity import (
    IDENTITY_FILE,
    PEERS_FILE,
    IdentityError,
    NodeIdentity,
    load_key,
    load_peers,
    write_simulated_identities,
)

#: Node config key: this node's SecAgg+ identity, an OpenSSH private key (e.g. its SuperNode key from ``privfed certs``).
SECAGG_IDENTITY = "secagg-identity"
#: Node config key: a file of the OpenSSH public keys this node accepts as SecAgg+ neighbours (``privfed certs``
#: writes ``supernode-peers.pub``).
SECAGG_PEERS = "secagg-peers"
#: Node config key: how many of a round's clients may be corrupt and colluding with the server (default 0); the node
#: refuses a threshold ``t`` unless ``2t > n + this`` for ``n`` shares.
SECAGG_MAX_CORRUPT = "secagg-max-corrupt"
#: Node config key (``--node-config "state-dir='/var/lib/privfed'"``): where the node keeps its own privacy
#: ledger, stored reply and signed survivor set, one file each per partition, across restarts and runs.
STATE_DIR = "state-dir"
#: Where a node records the survivor set it signed for each round (``{}``: the partition).
SIGNED_FILE = "privfed-secagg-partition-{}.json"
#: Held while a simulation's first node writes every node's identity.
IDENTITIES_LOCK = "secagg-identities.lock"
#: Context record of the same, for a node without a state folder (it lasts as long as the node's context).
_SIGNED_RECORD = "privfed_secagg_signed"


class TrustMissing(RuntimeError):
    """The node has no SecAgg+ identity or pinned peers: it takes part in no SecAgg+ round."""


@dataclass(frozen=True)
class SignedSurvivors:
    """The survivor set a node signed for one round of one run, by identity (node ids change on a restart)."""

    run: int
    round: int
    survivors: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.run}:{self.round}"

    @property
    def digest(self) -> str:
        return hashlib.sha256("\n".join(sorted(self.survivors)).encode()).hexdigest()


class SignedRounds:
    """Every survivor set this node signed, one per round of a run, so a round asked again is unmasked for that set only.

    A resumed run asks a round again, and a round that charged nothing may be
    computed again; were the node to sign another survivor set for it, the
    server would hold two sums of one round over different clients, and their
    difference. Kept in ``path`` (None: in the node's context), a digest per round.
    """

    def __init__(self, path: Path | None, context: Context) -> None:
        self.path = path
        self._context = context

    def check_and_record(self, signed: SignedSurvivors) -> None:
        """Records ``signed``; refuses one that differs from what this node signed for the same run and round."""
        with locked(None if self.path is None else self.path.with_name(self.path.name + ".lock")):
            rounds = self._read()
            before = rounds.get(signed.key)
            if before is not None and before != signed.digest:
                raise IdentityError(
                    f"this node already signed another survivor set for round {signed.round} of this run; "
                    "a round asked again is unmasked only for the same clients"
                )
            if before is None:
                self._write({**rounds, signed.key: signed.digest})

    def _read(self) -> dict[str, str]:
        if self.path is None:
            record = self._context.state.config_records.get(_SIGNED_RECORD)
            text = None if record is None else str(record["json"])
        else:
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                text = None
            except (OSError, UnicodeDecodeError) as err:
                raise IdentityError(f"cannot read the survivor sets this node signed ({self.path}): {err}") from None
        if text is None:
            return {}
        try:
            data = json.loads(text)
            if data.get("format") != 2:
                raise ValueError(f"format {data.get('format')!r}")
            return {str(key): str(value) for key, value in data["rounds"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            # Unreadable: it may hide a signed set, so this node signs nothing until someone looks.
            raise IdentityError(f"the survivor sets this node signed ({self.path}) are unreadable: {err}") from None

    def _write(self, rounds: dict[str, str]) -> None:
        text = json.dumps({"format": 2, "rounds": rounds})
        if self.path is None:
            self._context.state.config_records[_SIGNED_RECORD] = ConfigRecord({"json": text})
            return
        write_whole(self.path, partial(_write_text, text=text))


def _write_text(path: Path, *, text: str) -> None:
    path.write_text(text)


@dataclass(frozen=True)
class NodeTrust:
    """A node's SecAgg+ trust: its identity and pins, its bound on corrupt clients, its record of signed rounds."""

    identity: NodeIdentity
    max_corrupt: int
    signed: SignedRounds
    run_key: int


TrustOf = Callable[[Context], NodeTrust]
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Parse(Protocol[T_co]):
    """A file's parser (:func:`~privfed.secagg.identity.load_key`, :func:`~privfed.secagg.identity.load_peers`)."""

    def __call__(self, path: Path, /, *, data: bytes | None = None) -> T_co: ...


def node_trust(context: Context, *, state_dir: Path | None = None, run_key: int | None = None) -> NodeTrust:
    """The node's trust from its node config; in a simulation (``state_dir`` given), from the identities the
    simulation keeps in that folder, made by its first node."""
    node = context.node_config
    folder = Path(str(node[STATE_DIR])) if node.get(STATE_DIR) else state_dir
    partition = node.get("partition-id")
    if node.get(SECAGG_IDENTITY) or node.get(SECAGG_PEERS):
        if not (node.get(SECAGG_IDENTITY) and node.get(SECAGG_PEERS)):
            raise TrustMissing(f"set both {SECAGG_IDENTITY} and {SECAGG_PEERS} in the node config")
        key_file, peers_file = Path(str(node[SECAGG_IDENTITY])), Path(str(node[SECAGG_PEERS]))
    elif state_dir is not None and partition is not None:  # a simulation: its first node makes every node's identity
        key_file, peers_file = state_dir / IDENTITY_FILE.format(int(partition)), state_dir / PEERS_FILE
        _simulated_identities_written(state_dir, int(node["num-partitions"]), key_file, peers_file)
    else:
        raise TrustMissing(
            f"this node has no SecAgg+ identity: start it with --node-config "
            f"\"{SECAGG_IDENTITY}='<its private key>' {SECAGG_PEERS}='<the pinned public keys>'\" (docs/deployment.md)"
        )
    max_corrupt = max_corrupt_of(node)
    record = None if folder is None or partition is None else folder / SIGNED_FILE.format(int(partition))
    key = int(context.run_id) if run_key is None else run_key
    return NodeTrust(cached_identity(key_file, peers_file), max_corrupt, SignedRounds(record, context), key)


#: Every (folder, node count) whose simulated identities this process has seen written.
_WRITTEN: set[tuple[Path, int]] = set()
#: What this process parsed from each key or peers file, by the file, its bytes' digest and the parser (one file may be
#: named as both: :func:`cached_identity`).
_PARSED: dict[tuple[Path, bytes, Any], Any] = {}
#: A long-lived process meets few identity files; the cache is emptied rather than left to grow past this.
_PARSED_MAX = 1024


def _simulated_identities_written(state_dir: Path, count: int, key_file: Path, peers_file: Path) -> None:
    """Writes a simulation's identities unless this process saw them written and the node's own files are there.

    Once per folder and process, so not every SecAgg+ message takes the lock and checks every node's file.
    """
    if (state_dir, count) in _WRITTEN and key_file.is_file() and peers_file.is_file():
        return
    make_folder(state_dir)
    with locked(state_dir / IDENTITIES_LOCK):
        write_simulated_identities(state_dir, count)
    _WRITTEN.add((state_dir, count))


def cached_identity(key_file: Path, peers_file: Path) -> NodeIdentity:
    """:func:`~privfed.secagg.identity.load_identity`, each file parsed again only when its bytes changed.

    A node reads its trust at every SecAgg+ stage, and a simulation's nodes share one peers file: parsing every
    pinned key each time cost a round of ``n`` nodes ``n^2`` key loads per stage. Each file is still read at every
    message, so a changed identity or pin list takes effect at the next one, as before.
    """
    return NodeIdentity(_parsed(key_file, load_key), _parsed(peers_file, load_peers))


def _parsed(path: Path, parse: Parse[T]) -> T:
    try:
        data = path.read_bytes()
    except OSError:
        return parse(path)  # it says why it cannot read the file
    cache_key = (path.absolute(), hashlib.sha256(data).digest(), parse)
    if cache_key in _PARSED:
        parsed: T = _PARSED[cache_key]
        return parsed
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    _PARSED[cache_key] = parsed = parse(path, data=data)
    return parsed


def max_corrupt_of(node_config: Mapping[str, object]) -> int:
    """The node's ``secagg-max-corrupt``: a whole number >= 0 (a fraction or a negative one is refused, not rounded)."""
    raw = node_config.get(SECAGG_MAX_CORRUPT, 0)
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise TrustMissing(f"{SECAGG_MAX_CORRUPT} must be a whole number >= 0, got {raw!r}") from None
    if value < 0 or isinstance(raw, bool):
        raise TrustMissing(f"{SECAGG_MAX_CORRUPT} must be a whole number >= 0, got {raw!r}")
    return value
