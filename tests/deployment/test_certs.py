"""`privfed certs`: keys and certificates that Flower 1.41 and Python's TLS stack accept."""

from __future__ import annotations

import ipaddress
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
from flwr.cli.supernode.register import try_load_public_key
from flwr.supercore.primitives.asymmetric import public_key_to_bytes, uses_nist_ec_curve

from privfed.deployment.certs import (
    DEFAULT_HOSTS,
    CredentialPaths,
    generate_credentials,
    subject_alternative_names,
    write_credentials,
)
from privfed.errors import PrivfedError


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
    before = {path: path.read_bytes() for path in paths.all_files()}

    with pytest.raises(PrivfedError, match="--force"):
        write_credentials(generate_credentials(3), tmp_path / "certs")
    assert {path: path.read_bytes() for path in paths.all_files()} == before

    paths.ca_key.chmod(0o644)  # a replaced key must not inherit a looser mode
    write_credentials(generate_credentials(3), tmp_path / "certs", force=True)
    assert paths.ca_certificate.read_bytes() != before[paths.ca_certificate]
    assert stat.S_IMODE(paths.ca_key.stat().st_mode) == 0o600


def test_one_existing_file_blocks_the_whole_set(tmp_path):
    (tmp_path / "supernode-1.pub").write_text("someone else's key\n")
    with pytest.raises(PrivfedError, match=r"supernode-1\.pub"):
        write_credentials(generate_credentials(2), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["supernode-1.pub"]


def test_bad_counts_are_user_errors():
    with pytest.raises(PrivfedError):
        generate_credentials(-1)
    with pytest.raises(PrivfedError):
        generate_credentials(1, valid_days=0)


def test_cli_writes_the_files_and_prints_the_next_commands(run_privfed, tmp_path: Path):
    out = tmp_path / "certs"
    result = run_privfed("certs", "--out-dir", str(out), "--supernodes", "1", "--host", "fl.example.org", "--port", "9443")
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("ca.pem", "ca.key", "superlink.pem", "superlink.key", "supernode-0", "supernode-0.pub"):
        assert (out / name).is_file(), name
        assert name in result.stdout
    assert "flower-superlink" in result.stdout and "--enable-supernode-auth" in result.stdout
    assert f"flwr supernode register {out / 'supernode-0.pub'}" in result.stdout
    assert "fl.example.org:9443" in result.stdout
    assert "partition-id=0 num-partitions=1" in result.stdout

    again = run_privfed("certs", "--out-dir", str(out), "--supernodes", "1")
    assert again.returncode == 2
    assert "refusing to overwrite" in again.stderr and "Traceback" not in again.stderr

    forced = run_privfed("certs", "--out-dir", str(out), "--supernodes", "1", "--force")
    assert forced.returncode == 0, forced.stderr
