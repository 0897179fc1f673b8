"""Node identities for SecAgg+ against a deviating server (docs/privacy.md, "SecAgg+ against a deviating server").

Each node signs what it tells its neighbours through the server: its round
keys (the advertisement), the cohort it saw (its view) and the survivor set
it agrees to unmask. A neighbour checks each signature against identities it
pins itself, never against a list the server supplies. An identity is an
OpenSSH public key: the SuperNode keys of ``privfed certs`` (ECDSA P-384),
or Ed25519 keys for a simulation. Every signed message starts with a
domain tag of this protocol, so no signature Flower makes with the same key
(an ASCII timestamp) can stand for one of these.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

#: Binds every signature to this protocol and to what is signed.
_DOMAIN = b"privfed-secagg+/4\x00"

#: Where a simulation keeps its nodes' identities: in each node's state folder (``{}``: the partition).
IDENTITY_FILE = "secagg-identity-partition-{}"
#: The pinned identities a simulation's nodes share, one OpenSSH public key per line.
PEERS_FILE = "secagg-peers.pub"

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


class IdentityError(ValueError):
    """A signature, identity or pinned list that a node must not accept."""


def public_line(key: PrivateKey) -> bytes:
    """A key's identity: its OpenSSH public key without comment."""
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


@dataclass(frozen=True)
class NodeIdentity:
    """A node's signing key and the identities it pins (its own among them)."""

    key: PrivateKey
    pinned: frozenset[bytes]

    def __post_init__(self) -> None:
        if self.public not in self.pinned:
            raise IdentityError("this node's own identity is not among the identities it pins")

    @property
    def public(self) -> bytes:
        return public_line(self.key)

    def sign(self, message: bytes) -> bytes:
        if isinstance(self.key, ed25519.Ed25519PrivateKey):
            return self.key.sign(message)
        return self.key.sign(message, ec.ECDSA(hashes.SHA384()))


def verify(identity: bytes, signature: bytes, message: bytes) -> None:
    """Raises :class:`IdentityError` unless ``signature`` is ``identity``'s on ``message``."""
    try:
        key = serialization.load_ssh_public_key(identity)
        if isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, message)
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, message, ec.ECDSA(hashes.SHA384()))
        else:
            raise IdentityError(f"identities are ECDSA or Ed25519 keys, not {type(key).__name__}")
    except IdentityError:
        raise
    except Exception:  # InvalidSignature, a malformed key, cryptography's UnsupportedAlgorithm for an unknown type
        raise IdentityError("a signature does not verify under the identity it names") from None


def _frame(*parts: bytes) -> bytes:
    """``parts`` joined unambiguously (each after its length), behind the protocol's domain tag."""
    return _DOMAIN + b"".join(len(part).to_bytes(8, "big") + part for part in parts)


def _number(value: int) -> bytes:
    return str(int(value)).encode()


def advert_message(
    *, run_id: int, round_label: str, node_id: int, sample: int, shares: int, threshold: int, pk1: bytes, pk2: bytes
) -> bytes:
    """What a node signs at setup: its round keys, for this run, round and protocol parameters."""
    numbers = (_number(n) for n in (run_id, node_id, sample, shares, threshold))
    return _frame(b"advert", round_label.encode(), *numbers, pk1, pk2)


def view_digest(view: Mapping[int, tuple[bytes, bytes, bytes]]) -> bytes:
    """The digest of a cohort: each node's id, identity and round keys, in node-id order.

    The round keys are fresh each time a round is set up, so a signature on a
    view belongs to that one run of the protocol.
    """
    digest = hashlib.sha256(_DOMAIN + b"view")
    for node in sorted(view):
        digest.update(_frame(_number(node), *view[node]))
    return digest.digest()


def view_message(digest: bytes) -> bytes:
    """What a node signs when it shares its keys: the cohort it shares them with."""
    return _frame(b"view", digest)


def survivors_message(digest: bytes, survivors: Iterable[int]) -> bytes:
    """What a node signs before unmasking: the survivor set, within the view it saw."""
    return _frame(b"survivors", digest, b",".join(_number(n) for n in sorted(set(survivors))))


def load_identity(key_file: Path, peers_file: Path) -> NodeIdentity:
    """A node's identity from its OpenSSH private key and its file of pinned public keys."""
    return NodeIdentity(load_key(key_file), load_peers(peers_file))


def load_key(key_file: Path, *, data: bytes | None = None) -> PrivateKey:
    """A node's signing key from its OpenSSH private key file (``data``: the file's bytes, when already read)."""
    try:
        key = serialization.load_ssh_private_key(key_file.read_bytes() if data is None else data, password=None)
    except (OSError, ValueError, TypeError) as err:
        raise IdentityError(f"cannot read the SecAgg+ identity key {key_file}: {err}") from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey)):
        raise IdentityError(f"{key_file} is a {type(key).__name__}; SecAgg+ identities are ECDSA or Ed25519 keys")
    return key


def load_peers(peers_file: Path, *, data: bytes | None = None) -> frozenset[bytes]:
    """The identities in a file of OpenSSH public keys (one per line; comments and blank lines skipped; ``data``: the
    file's bytes, when already read)."""
    try:
        lines = (peers_file.read_bytes() if data is None else data).splitlines()
    except OSError as err:
        raise IdentityError(f"cannot read the pinned SecAgg+ identities {peers_file}: {err}") from None
    pinned = set()
    for line in lines:
        if not line.strip() or line.lstrip().startswith(b"#"):
            continue
        try:
            key = serialization.load_ssh_public_key(b" ".join(line.split()[:2]))
        except (ValueError, TypeError, IndexError, UnsupportedAlgorithm):
            raise IdentityError(f"{peers_file} holds a line that is not an OpenSSH public key") from None
        pinned.add(key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    if not pinned:
        raise IdentityError(f"{peers_file} pins no identity")
    return frozenset(pinned)


def write_simulated_identities(folder: Path, count: int) -> None:
    """Gives a simulation's ``count`` nodes Ed25519 identities and their pinned list, unless ``folder`` has them.

    In a simulation every node and the server share one machine, so these
    keys exercise the protocol; they protect nothing from whoever runs it.
    """
    from privfed.durable import write_whole

    peers = folder / PEERS_FILE
    if peers.is_file() and all((folder / IDENTITY_FILE.format(i)).is_file() for i in range(count)):
        return
    identities = simulated_identities(count)
    for i, identity in enumerate(identities):
        private = identity.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        write_whole(folder / IDENTITY_FILE.format(i), partial(_write_bytes, data=private))
    write_whole(peers, partial(_write_bytes, data=b"".join(identity.public + b"\n" for identity in identities)))


def simulated_identities(count: int) -> list[NodeIdentity]:
    """``count`` fresh Ed25519 identities, each pinning all of them."""
    keys = [ed25519.Ed25519PrivateKey.generate() for _ in range(count)]
    pinned = frozenset(public_line(key) for key in keys)
    return [NodeIdentity(key, pinned) for key in keys]


def _write_bytes(path: Path, *, data: bytes) -> None:
    path.write_bytes(data)


# What travels, by the config key it travels under.
#: Setup reply: the node's identity, and its signature on :func:`advert_message`.
IDENTITY_KEY = "privfed_identity"
ADVERT_SIGNATURE_KEY = "privfed_advert_signature"
#: Share-keys request: each neighbour's identity and advertisement signature, aligned with the node ids.
ADVERT_NODES_KEY = "privfed_advert_nodes"
ADVERT_IDENTITIES_KEY = "privfed_advert_identities"
ADVERT_SIGNATURES_KEY = "privfed_advert_signatures"
#: Share-keys reply: the node's signature on :func:`view_message`; masked-vector request: each source's, aligned with
#: Flower's source list.
VIEW_SIGNATURE_KEY = "privfed_view_signature"
VIEW_SIGNATURES_KEY = "privfed_view_signatures"
#: The stage between the masked vectors and the unmasking, in which every survivor signs the survivor set.
CONSISTENCY_STAGE = "privfed_consistency"
#: Consistency and unmask requests: the survivor set; consistency reply: the node's signature on it; unmask
#: request: who signed it, and their signatures.
SURVIVORS_KEY = "privfed_survivors"
SURVIVORS_SIGNATURE_KEY = "privfed_survivors_signature"
SIGNERS_KEY = "privfed_signers"
SIGNATURES_KEY = "privfed_signatures"
