"""TLS and SuperNode-authentication material for a Flower deployment (docs/deployment.md, step 1).

Flower reads SuperNode keys in OpenSSH format and accepts only NIST curves,
hence P-384. Each SuperNode key is also that node's SecAgg+ identity
(:mod:`privfed.secagg.identity`), and every SuperNode pins the others' public
keys from :data:`SUPERNODE_PEERS_FILE`. :func:`write_credentials` is the only
function that touches the disk.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from privfed.errors import PrivfedError

#: Names always in the SuperLink certificate: the SuperLink starts its own ServerApp executor against
#: ``127.0.0.1`` (or ``::1``) even when it listens on ``0.0.0.0``, so these must always verify.
DEFAULT_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
DEFAULT_VALID_DAYS = 365
#: Flower's own default for ``flower-superlink --port``.
DEFAULT_SUPERLINK_PORT = 8000

_CLOCK_SKEW = dt.timedelta(minutes=5)  # validity starts this early, for machines whose clocks lag
_DNS_NAME = re.compile(r"(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


#: Every SuperNode's public key, one per line: the SecAgg+ identities each SuperNode pins (its ``secagg-peers``).
SUPERNODE_PEERS_FILE = "supernode-peers.pub"


def supernode_key_file(partition_id: int) -> str:
    """SuperNode ``partition_id``'s private key file (``.pub`` for its public key), numbered like partitions."""
    return f"supernode-{partition_id}"


def subject_alternative_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """SAN entries for ``hosts``: IP addresses as such (clients never match an IP to a DNS name), others as DNS names.

    Raises:
        PrivfedError: A host that is neither (typically ``host:port`` or a URL).
    """
    names: dict[object, x509.GeneralName] = {}
    for raw in hosts:
        host = raw.strip().strip("[]")
        if not host:
            continue
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            if not _DNS_NAME.fullmatch(host):
                raise PrivfedError(
                    f"{raw!r} is neither an IP address nor a host name (give the bare name, without scheme or port)"
                ) from None
            names.setdefault(host.lower(), x509.DNSName(host))
        else:
            names.setdefault(ip, x509.IPAddress(ip))
    return list(names.values())


def _key_usage(**allowed: bool) -> x509.KeyUsage:
    """An EC key's usages: digital signatures plus ``allowed``; everything else off."""
    flags = dict.fromkeys(
        ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
         "key_cert_sign", "crl_sign", "encipher_only", "decipher_only"),
        False,
    )
    return x509.KeyUsage(digital_signature=True, **{**flags, **allowed})


def _certificate(
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[ec.EllipticCurvePrivateKey, x509.Name] | None,
    extensions: list[tuple[x509.ExtensionType, bool]],
    validity: tuple[dt.datetime, dt.datetime],
) -> x509.Certificate:
    """``key``'s certificate, signed by ``issuer`` (its key and name) or by itself, with ``(extension, critical)``."""
    name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "privfed"), x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])
    issuer_key, issuer_name = issuer or (key, name)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA384())


def supernode_key_pair(comment: str = "") -> tuple[bytes, bytes]:
    """One SuperNode's keys: (OpenSSH private key, unencrypted for ``flower-supernode``; public line + ``comment``)."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public + (b" " + comment.encode("ascii") if comment else b"") + b"\n"


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


@dataclass(frozen=True)
class Credentials:
    """Everything a federation needs, as file contents (nothing written yet)."""

    ca_certificate: bytes
    ca_key: bytes
    superlink_certificate: bytes
    superlink_key: bytes
    supernode_keys: tuple[bytes, ...]
    supernode_public_keys: tuple[bytes, ...]
    hosts: tuple[str, ...]

    @property
    def supernode_peers(self) -> bytes:
        """The pinned SecAgg+ identities: every SuperNode's public key line."""
        return b"".join(self.supernode_public_keys)


def generate_credentials(
    num_supernodes: int, hosts: Iterable[str] = (), *, valid_days: int = DEFAULT_VALID_DAYS, now: dt.datetime | None = None
) -> Credentials:
    """A CA, a SuperLink certificate for :data:`DEFAULT_HOSTS` + ``hosts``, and one key pair per SuperNode.

    The CA signs only end-entity certificates (``path_length=0``: a leaked
    server key cannot mint CAs); the server certificate carries what strict
    verifiers (``ssl``, httpx, gRPC) insist on. ``now`` pins the start of validity.

    Raises:
        PrivfedError: A count or lifetime that cannot be right, or a host that is not one.
    """
    if num_supernodes < 0:
        raise PrivfedError(f"the number of SuperNodes must be >= 0, got {num_supernodes}")
    if valid_days < 1:
        raise PrivfedError(f"certificates must be valid for at least one day, got {valid_days}")
    all_hosts = tuple(dict.fromkeys([*DEFAULT_HOSTS, *(h.strip() for h in hosts if h.strip())]))
    sans = subject_alternative_names(all_hosts)
    now = now or dt.datetime.now(dt.UTC)
    validity = (now - _CLOCK_SKEW, now + dt.timedelta(days=valid_days))
    ca_key, server_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca = _certificate("privfed federation CA", ca_key, None, [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (_key_usage(key_cert_sign=True, crl_sign=True), True),
    ], validity)
    server = _certificate(f"privfed SuperLink {sans[0].value}", server_key, (ca_key, ca.subject), [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (_key_usage(key_agreement=True), True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (x509.SubjectAlternativeName(sans), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
    ], validity)
    pairs = [supernode_key_pair(supernode_key_file(i)) for i in range(num_supernodes)]
    return Credentials(
        ca_certificate=ca.public_bytes(serialization.Encoding.PEM),
        ca_key=_pem_key(ca_key),
        superlink_certificate=server.public_bytes(serialization.Encoding.PEM),
        superlink_key=_pem_key(server_key),
        supernode_keys=tuple(private for private, _ in pairs),
        supernode_public_keys=tuple(public for _, public in pairs),
        hosts=all_hosts,
    )


@dataclass(frozen=True)
class CredentialPaths:
    """Where :func:`write_credentials` puts each file (absolute paths)."""

    directory: Path
    ca_certificate: Path
    ca_key: Path
    superlink_certificate: Path
    superlink_key: Path
    supernode_keys: tuple[Path, ...]
    supernode_public_keys: tuple[Path, ...]
    #: :data:`SUPERNODE_PEERS_FILE` (None without SuperNodes: a file that pins nobody is refused by every node).
    supernode_peers: Path | None = None

    @classmethod
    def in_directory(cls, directory: Path, num_supernodes: int) -> CredentialPaths:
        """The fixed layout inside ``directory``, so other tools can find the files."""
        directory = Path(directory).expanduser().resolve()
        keys = tuple(directory / supernode_key_file(i) for i in range(num_supernodes))
        return cls(
            directory, directory / "ca.pem", directory / "ca.key", directory / "superlink.pem",
            directory / "superlink.key", keys, tuple(k.with_name(k.name + ".pub") for k in keys),
            directory / SUPERNODE_PEERS_FILE if num_supernodes else None,
        )

    def private_files(self) -> tuple[Path, ...]:
        """Files that must stay readable by their owner only."""
        return (self.ca_key, self.superlink_key, *self.supernode_keys)

    def all_files(self) -> tuple[Path, ...]:
        """Every file, in the order they are reported to the user."""
        pairs = [f for pair in zip(self.supernode_keys, self.supernode_public_keys) for f in pair]
        peers = () if self.supernode_peers is None else (self.supernode_peers,)
        return (self.ca_certificate, self.ca_key, self.superlink_certificate, self.superlink_key, *pairs, *peers)


def _write(path: Path, data: bytes, private: bool) -> None:
    """Creates ``path`` with its final mode from the start: a private key is never readable by others, even briefly."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    if private:
        os.chmod(path, 0o600)  # the umask can only remove bits; make the mode exact


def write_credentials(credentials: Credentials, directory: Path, *, force: bool = False) -> CredentialPaths:
    """Writes ``credentials`` into ``directory``, or nothing: existing files without ``force`` raise PrivfedError."""
    paths = CredentialPaths.in_directory(directory, len(credentials.supernode_keys))
    existing = [p for p in paths.all_files() if p.exists()]
    if existing and not force:
        names = ", ".join(str(p) for p in existing)
        raise PrivfedError(f"refusing to overwrite existing files ({names}); use --force to replace them")
    paths.directory.mkdir(parents=True, exist_ok=True)
    private = set(paths.private_files())
    c = credentials
    files = [c.ca_certificate, c.ca_key, c.superlink_certificate, c.superlink_key]
    files += [f for pair in zip(c.supernode_keys, c.supernode_public_keys, strict=True) for f in pair]
    files += [c.supernode_peers] if paths.supernode_peers is not None else []
    for path, data in zip(paths.all_files(), files, strict=True):
        _write(path, data, private=path in private)
    return paths


def next_steps(paths: CredentialPaths, *, superlink_host: str = "127.0.0.1", port: int = DEFAULT_SUPERLINK_PORT) -> str:
    """The commands of docs/deployment.md with the files just written filled in, for the user to copy."""
    address = f"[{superlink_host}]:{port}" if ":" in superlink_host else f"{superlink_host}:{port}"
    num = len(paths.supernode_keys)
    lines = [
        "1. Start the SuperLink (serves Fleet, Control and Runtime APIs on one TLS port):",
        f"   flower-superlink --host 0.0.0.0 --port {port} \\",
        f"     --ssl-ca-certfile {paths.ca_certificate} \\",
        f"     --ssl-certfile {paths.superlink_certificate} \\",
        f"     --ssl-keyfile {paths.superlink_key} \\",
        "     --enable-supernode-auth --disable-runtime-dependency-installation",
        "",
        "2. Point the flwr CLI at it: run `flwr config ls` once (it creates $FLWR_HOME/config.toml,",
        "   default ~/.flwr/config.toml), then add to that file:",
        "   [superlink.privfed]",
        f'   address = "{address}"',
        f'   root-certificates = "{paths.ca_certificate}"',
    ]
    if num:
        lines += ["", "3. Register the SuperNodes' public keys:"]
        lines += [f"   flwr supernode register {pub} privfed" for pub in paths.supernode_public_keys]
        peers = paths.supernode_peers or paths.directory / SUPERNODE_PEERS_FILE
        lines += [
            "", "4. Start one SuperNode per partition (each on its own machine, or with its own --port); its key is",
            f"   also its SecAgg+ identity, and it accepts as SecAgg+ neighbours the keys in {SUPERNODE_PEERS_FILE}:",
        ]
        for i, key in enumerate(paths.supernode_keys):
            lines += [
                f"   flower-supernode --superlink {address} --root-certificates {paths.ca_certificate} \\",
                f"     --auth-supernode-private-key {key} --port {9094 + i} \\",
                f'     --node-config "partition-id={i} num-partitions={num} \\',
                f'       {supernode_node_config(key, peers)}"',
            ]
    step = 5 if num else 3
    lines += [
        "",
        f"{step}. Run the app (num-clients must equal the number of SuperNodes; out must be absolute):",
        f"   flwr run . privfed --run-config \"num-clients={num or 'N'} participation=1.0 out='/abs/path/run'\" --stream",
        "",
        f"Only {paths.ca_certificate.name}, {SUPERNODE_PEERS_FILE} and each SuperNode's own key go to other machines; "
        f"keep {paths.ca_key.name} and {paths.superlink_key.name} on the SuperLink host.",
    ]
    return "\n".join(lines)


def supernode_node_config(key: Path, peers: Path) -> str:
    """The ``--node-config`` entries that make a SuperNode's key its SecAgg+ identity, pinning ``peers``."""
    from privfed.secagg.client_trust import SECAGG_IDENTITY, SECAGG_PEERS

    return f"{SECAGG_IDENTITY}='{key}' {SECAGG_PEERS}='{peers}'"
