"""`privfed certs`: keys and certificates that Flower 1.41 and Python's TLS stack accept, and SuperNode keys that
privfed's SecAgg+ takes as identities."""

from __future__ import annotations

import ipaddress
import shlex
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from flwr.app import Context, RecordDict
from flwr.cli.supernode.register import try_load_public_key
from flwr.common.config import parse_config_args
from flwr.supercore.primitives.asymmetric import public_key_to_bytes, uses_nist_ec_curve

from privfed.deployment.certs import (
    DEFAULT_HOSTS,
    SUPERNODE_PEERS_FILE,
    CredentialPaths,
    generate_credentials,
    next_steps,
    subject_alternative_names,
    write_credentials,
)
from privfed.errors import PrivfedError
from privfed.secagg.client_trust import node_trust
from privfed.secagg.identity import IdentityError, load_identity, verify


@pytest.fixture(scope="module")
def credentials():
    return generate_credentials(3, ["superlink.example.org", "10.1.2.3", "localhost", " "])


def test_server_certificate_is_signed_by_the_ca_for_every_host(credentials):
    ca = x509.load_pem_x509_certificate(credentials.ca_certificate)
    server = x509.load_pem_x509_certificate(credentials.superlink_certificate)
    server.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(sans.get_values_for_type(x509.DNSName)) == ["localhost", "superlink.example.org"]
    assert sorted(map(str, sans.get_values_for_type(x509.IPAddress))) == ["10.1.2.3", "127.0.0.1", "::1"]
    assert credentials.hosts == (*DEFAULT_HOSTS, "superlink.example.org", "10.1.2.3")


def test_ip_addresses_become_ip_entries_and_duplicates_are_dropped():
    names = subject_alternative_names(["[::1]", "0:0:0:0:0:0:0:1", "Example.org", "example.org", "192.0.2.7"])
    assert names == [
        x509.IPAddress(ipaddress.ip_address("::1")),
        x509.DNSName("Example.org"),
        x509.IPAddress(ipaddress.ip_address("192.0.2.7")),
    ]


@pytest.mark.parametrize("host", ["fl.example.org:8000", "https://fl.example.org", "two words"])
def test_a_host_with_port_or_scheme_is_refused(host):
    with pytest.raises(PrivfedError, match="neither an IP address nor a host name"):
        generate_credentials(1, [host])


def test_supernode_keys_load_with_flowers_own_loaders(credentials, tmp_path):
    assert len(credentials.supernode_keys) == len(credentials.supernode_public_keys) == 3
    assert len(set(credentials.supernode_public_keys)) == 3
    for i, (private_bytes, public_line) in enumerate(zip(credentials.supernode_keys, credentials.supernode_public_keys)):
        # flower-supernode --auth-supernode-private-key reads the key this way
        private = serialization.load_ssh_private_key(private_bytes, None)
        assert isinstance(private, ec.EllipticCurvePrivateKey) and uses_nist_ec_curve(private.public_key())
        # `flwr supernode register KEY.pub` parses the public key with this function
        pub = tmp_path / f"node-{i}.pub"
        pub.write_bytes(public_line)
        assert try_load_public_key(pub) == public_key_to_bytes(private.public_key())
        assert public_line.decode().startswith("ecdsa-sha2-nistp384 ")
        assert public_line.decode().rstrip().endswith(f" supernode-{i}")


def test_each_supernode_key_is_a_secagg_identity_that_pins_every_supernode(credentials, tmp_path):
    """The P-384 key Flower authenticates a SuperNode with signs its SecAgg+ messages; supernode-peers.pub holds every
    SuperNode's public key, one per line, and each signature verifies under its own line only."""
    paths = write_credentials(credentials, tmp_path)
    assert paths.supernode_peers == tmp_path.resolve() / SUPERNODE_PEERS_FILE
    lines = paths.supernode_peers.read_bytes().splitlines(keepends=True)
    assert lines == [pub.read_bytes() for pub in paths.supernode_public_keys]
    identities = [load_identity(key, paths.supernode_peers) for key in paths.supernode_keys]
    publics = [identity.public for identity in identities]
    assert len(set(publics)) == 3
    for identity, line in zip(identities, lines):
        assert isinstance(identity.key, ec.EllipticCurvePrivateKey) and identity.key.curve.name == "secp384r1"
        assert identity.public == b" ".join(line.split()[:2])  # the line without its comment
        assert identity.pinned == frozenset(publics)
    message = b"a SecAgg+ message"
    signature = identities[0].sign(message)
    verify(publics[0], signature, message)
    for other in publics[1:]:
        with pytest.raises(IdentityError):
            verify(other, signature, message)


def test_the_printed_supernode_commands_give_each_node_its_secagg_identity(credentials, tmp_path):
    """Each printed ``flower-supernode`` command, as a shell splits it and Flower parses its node config, names the
    node's own key and the peers file, and privfed's node resolves its SecAgg+ trust from that config."""
    paths = write_credentials(credentials, tmp_path)
    commands = [
        shlex.split(command) for command in next_steps(paths).replace("\\\n", "").splitlines()
        if command.strip().startswith("flower-supernode")
    ]
    assert len(commands) == 3
    for i, (command, key) in enumerate(zip(commands, paths.supernode_keys)):
        node_config = parse_config_args([command[command.index("--node-config") + 1]])
        assert node_config == {
            "partition-id": i, "num-partitions": 3,
            "secagg-identity": str(key), "secagg-peers": str(paths.supernode_peers),
        }
        assert command[command.index("--auth-supernode-private-key") + 1] == str(key)
        trust = node_trust(Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config={}))
        assert trust.identity.public == load_identity(key, paths.supernode_peers).public
        assert trust.max_corrupt == 0


def test_tls_handshake_verifies_with_the_ca_only(credentials, tmp_path):
    paths = write_credentials(credentials, tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(paths.superlink_certificate, paths.superlink_key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve(connections: int) -> None:
        for _ in range(connections):
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, args=(3,), daemon=True)
    thread.start()
    try:
        trusting = ssl.create_default_context(cafile=str(paths.ca_certificate))
        for host in ("localhost", "127.0.0.1"):
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                trusting.wrap_socket(raw, server_hostname=host) as tls,
            ):
                assert tls.getpeercert()["subject"]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, pytest.raises(ssl.SSLCertVerificationError):
            ssl.create_default_context().wrap_socket(raw, server_hostname="localhost")
    finally:
        thread.join(timeout=10)
        listener.close()


def test_private_keys_are_owner_only_and_nothing_is_overwritten(credentials, tmp_path):
    paths = write_credentials(credentials, tmp_path / "certs")
    assert paths == CredentialPaths.in_directory(tmp_path / "certs", 3)
    for path in paths.private_files():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in paths.all_files():
        assert path.is_file()
    assert paths.supernode_peers in paths.all_files() and paths.supernode_peers not in paths.private_files()
    before = {path: path.read_bytes() for path in paths.all_files()}

    with pytest.raises(PrivfedError, match="--force"):
        write_credentials(generate_credentials(3), tmp_path / "certs")
    assert {path: path.read_bytes() for path in paths.all_files()} == before

    paths.ca_key.chmod(0o644)  # a replaced key must not inherit a looser mode
    write_credentials(generate_credentials(3), tmp_path / "certs", force=True)
    assert paths.ca_certificate.read_bytes() != before[paths.ca_certificate]
    assert stat.S_IMODE(paths.ca_key.stat().st_mode) == 0o600


@pytest.mark.parametrize("name", ["supernode-1.pub", SUPERNODE_PEERS_FILE])
def test_one_existing_file_blocks_the_whole_set(tmp_path, name):
    (tmp_path / name).write_text("someone else's key\n")
    with pytest.raises(PrivfedError, match=name.replace(".", r"\.")):
        write_credentials(generate_credentials(2), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_without_supernodes_no_peers_file_is_written(tmp_path):
    """A peers file that pins nobody would be refused by every node (load_peers)."""
    paths = write_credentials(generate_credentials(0), tmp_path)
    assert paths.supernode_peers is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.key", "ca.pem", "superlink.key", "superlink.pem"]


def test_bad_counts_are_user_errors():
    with pytest.raises(PrivfedError):
        generate_credentials(-1)
    with pytest.raises(PrivfedError):
        generate_credentials(1, valid_days=0)


def test_cli_writes_the_files_and_prints_the_next_commands(run_privfed, tmp_path: Path):
    out = tmp_path / "certs"
    result = run_privfed("certs", "--out-dir", str(out), "--supernodes", "1", "--host", "fl.example.org", "--port", "9443")
    assert result.returncode == 0, result.stdout + result.stderr
    written = ("ca.pem", "ca.key", "superlink.pem", "superlink.key", "supernode-0", "supernode-0.pub", SUPERNODE_PEERS_FILE)
    for name in written:
        assert (out / name).is_file(), name
        assert name in result.stdout
    assert "flower-superlink" in result.stdout and "--enable-supernode-auth" in result.stdout
    assert f"flwr supernode register {out / 'supernode-0.pub'}" in result.stdout
    assert "fl.example.org:9443" in result.stdout
    assert "partition-id=0 num-partitions=1" in result.stdout
    assert f"secagg-identity='{out / 'supernode-0'}' secagg-peers='{out / SUPERNODE_PEERS_FILE}'" in result.stdout
    assert (out / SUPERNODE_PEERS_FILE).read_bytes() == (out / "supernode-0.pub").read_bytes()

    again = run_privfed("certs", "--out-dir", str(out), "--supernodes", "1")
    assert again.returncode == 2
    assert "refusing to overwrite" in again.stderr and "Traceback" not in again.stderr

    forced = run_privfed("certs", "--out-dir", str(out), "--supernodes", "1", "--force")
    assert forced.returncode == 0, forced.stderr
