"""What a node trusts in SecAgg+ against a deviating server: its identity, its pins, and the survivor sets it signed.

All of it comes from the node's own configuration, never from the server:
``secagg-identity`` and ``secagg-peers`` in its node config (deployment), or
the files a simulation writes into each node's state folder
(:func:`privfed.secagg.identity.write_simulated_identities`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from flwr.app import ConfigRecord, Context

from privfed.durable import locked, make_folder, write_whole
from privfed.secagg.identity import (
    IDENTITY_FILE,
    PEERS_FILE,
    IdentityError,
    NodeIdentity,
    load_identity,
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
#: Where a node records the last survivor set it signed (``{}``: the partition).
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

    def to_json(self) -> str:
        return json.dumps({"format": 1, "run": self.run, "round": self.round, "survivors": list(self.survivors)})

    @staticmethod
    def from_json(text: str) -> SignedSurvivors | None:
        try:
            data = json.loads(text)
            if data.get("format") != 1:
                return None
            return SignedSurvivors(int(data["run"]), int(data["round"]), tuple(str(s) for s in data["survivors"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


class SignedRounds:
    """The last survivor set this node signed, so a replayed round is unmasked for that set only.

    A resumed run asks a round again; the node answers with its stored reply,
    masked afresh. Were it to sign another survivor set for the same round,
    the server would hold two sums of one round over different clients, and
    their difference. Kept in ``path`` (None: in the node's context).
    """

    def __init__(self, path: Path | None, context: Context) -> None:
        self.path = path
        self._context = context

    def check_and_record(self, signed: SignedSurvivors) -> None:
        """Records ``signed``; refuses one that differs from what this node signed for the same run and round."""
        with locked(None if self.path is None else self.path.with_name(self.path.name + ".lock")):
            before = self._read()
            if before is not None and (before.run, before.round) == (signed.run, signed.round):
                if before.survivors != signed.survivors:
                    raise IdentityError(
                        f"this node already signed another survivor set for round {signed.round} of this run; "
                        "a replay is unmasked only for the same clients"
                    )
                return
            self._write(signed)

    def _read(self) -> SignedSurvivors | None:
        if self.path is None:
            record = self._context.state.config_records.get(_SIGNED_RECORD)
            return None if record is None else SignedSurvivors.from_json(str(record["json"]))
        try:
            return SignedSurvivors.from_json(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as err:
            raise IdentityError(f"cannot read the survivor set this node signed ({self.path}): {err}") from None

    def _write(self, signed: SignedSurvivors) -> None:
        if self.path is None:
            self._context.state.config_records[_SIGNED_RECORD] = ConfigRecord({"json": signed.to_json()})
            return
        write_whole(self.path, partial(_write_text, text=signed.to_json()))


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
        make_folder(state_dir)
        with locked(state_dir / IDENTITIES_LOCK):
            write_simulated_identities(state_dir, int(node["num-partitions"]))
        key_file, peers_file = state_dir / IDENTITY_FILE.format(int(partition)), state_dir / PEERS_FILE
    else:
        raise TrustMissing(
            f"this node has no SecAgg+ identity: start it with --node-config "
            f"\"{SECAGG_IDENTITY}='<its private key>' {SECAGG_PEERS}='<the pinned public keys>'\" (docs/deployment.md)"
        )
    max_corrupt = int(node.get(SECAGG_MAX_CORRUPT, 0))
    if max_corrupt < 0:
        raise TrustMissing(f"{SECAGG_MAX_CORRUPT} must be >= 0, got {max_corrupt}")
    record = None if folder is None or partition is None else folder / SIGNED_FILE.format(int(partition))
    key = int(context.run_id) if run_key is None else run_key
    return NodeTrust(load_identity(key_file, peers_file), max_corrupt, SignedRounds(record, context), key)
