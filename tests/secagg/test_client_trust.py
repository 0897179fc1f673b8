"""A node's SecAgg+ trust comes from its own config and files, read strictly, and as they are at each message."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from flwr.app import Context, RecordDict

from privfed.secagg import identity as ids
from privfed.secagg.client_trust import (
    SECAGG_IDENTITY,
    SECAGG_MAX_CORRUPT,
    SECAGG_PEERS,
    TrustMissing,
    max_corrupt_of,
    node_trust,
)


@pytest.mark.parametrize("given, read", [(None, 0), (0, 0), (2, 2), ("3", 3)])
def test_max_corrupt_is_a_whole_number_from_the_node_config(given, read):
    node = {} if given is None else {SECAGG_MAX_CORRUPT: given}
    assert max_corrupt_of(node) == read


@pytest.mark.parametrize("given", [-1, 1.9, "1.5", "two", True])
def test_a_max_corrupt_that_is_negative_or_not_whole_is_refused_not_rounded(given):
    """A fraction read as its floor would let a node count one corrupt client too few towards K_min."""
    with pytest.raises(TrustMissing, match=SECAGG_MAX_CORRUPT):
        max_corrupt_of({SECAGG_MAX_CORRUPT: given})


def _simulated_node(partition: int, count: int = 3) -> Context:
    return Context(run_id=1, node_id=100 + partition, node_config={"partition-id": partition, "num-partitions": count},
                   state=RecordDict(), run_config={})


def test_a_simulated_node_keeps_its_identity_across_messages_and_every_node_pins_every_other(tmp_path):
    trusts = [node_trust(_simulated_node(p), state_dir=tmp_path, run_key=0) for p in range(3)]
    again = [node_trust(_simulated_node(p), state_dir=tmp_path, run_key=0) for p in range(3)]
    publics = {trust.identity.public for trust in trusts}
    assert [t.identity.public for t in again] == [t.identity.public for t in trusts] and len(publics) == 3
    assert all(trust.identity.pinned == publics for trust in again)


def test_a_changed_peers_file_or_identity_is_read_at_the_next_message_not_served_from_before(tmp_path):
    """The trust a node parsed is kept per process by the files' bytes; a pin list or key rewritten in place (same
    size, possibly the same modification time) is what the next message trusts."""
    key_file, peers_file = tmp_path / ids.IDENTITY_FILE.format(0), tmp_path / ids.PEERS_FILE
    ids.write_simulated_identities(tmp_path, 2)
    node = _simulated_node(0, count=2)
    first = node_trust(node, state_dir=tmp_path, run_key=0).identity
    other_public = ids.load_identity(tmp_path / ids.IDENTITY_FILE.format(1), peers_file).public
    assert other_public in first.pinned

    peers_file.write_bytes(b"# the other node is no longer pinned\n" + first.public + b"\n")
    assert node_trust(node, state_dir=tmp_path, run_key=0).identity.pinned == {first.public}

    replacement = ids.simulated_identities(1)[0]
    key_file.write_bytes(replacement.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    with pytest.raises(ids.IdentityError, match="own identity is not among"):
        node_trust(node, state_dir=tmp_path, run_key=0)  # its new key is not pinned: refused, not the old key
    peers_file.write_bytes(replacement.public + b"\n")
    assert node_trust(node, state_dir=tmp_path, run_key=0).identity.public == replacement.public


def test_a_simulated_identity_removed_during_a_run_is_written_again_and_pinned(tmp_path):
    node_trust(_simulated_node(0), state_dir=tmp_path, run_key=0)
    (tmp_path / ids.IDENTITY_FILE.format(1)).unlink()
    trust = node_trust(_simulated_node(1), state_dir=tmp_path, run_key=0)
    assert trust.identity.public in ids.load_peers(tmp_path / ids.PEERS_FILE)


def test_a_node_whose_identity_file_is_unreadable_is_refused_with_the_file_named(tmp_path):
    node = Context(run_id=1, node_id=1, state=RecordDict(), run_config={},
                   node_config={SECAGG_IDENTITY: str(tmp_path / "missing"), SECAGG_PEERS: str(tmp_path / "peers")})
    with pytest.raises(ids.IdentityError, match="missing"):
        node_trust(node)


def test_a_node_whose_peers_setting_names_its_key_file_is_refused_as_a_file_of_no_public_key(tmp_path: Path) -> None:
    """The parse cache is keyed by what parsed a file too: the key parsed from these bytes is no pin list."""
    ids.write_simulated_identities(tmp_path, 2)
    key_file = tmp_path / ids.IDENTITY_FILE.format(0)
    node = Context(
        run_id=1,
        node_id=1,
        state=RecordDict(),
        run_config={},
        node_config={SECAGG_IDENTITY: str(key_file), SECAGG_PEERS: str(key_file)},
    )
    with pytest.raises(ids.IdentityError, match="not an OpenSSH public key"):
        node_trust(node)
