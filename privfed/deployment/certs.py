"""TLS and SuperNode-authentication material for a Flower 1.41 deployment.

A federation that leaves one machine needs two kinds of keys:

* **TLS.** The SuperLink serves the Fleet, Control and Runtime APIs on one
  HTTPS port. Its certificate is signed by a private CA whose certificate
  every SuperNode (``--root-certificates``) and the ``flwr`` CLI
  (``root-certificates`` in ``config.toml``) use to recognise the SuperLink.
  A private CA rather than a self-signed server certificate keeps the trust
  anchor stable when the server certificate is reissued (new host names).
* **SuperNode authentication.** With ``--enable-supernode-auth`` the
  SuperLink only lets in SuperNodes whose public key an operator registered
  beforehand (``flwr supernode register KEY.pub``). Every request a SuperNode
  makes carries its public key and a signature over a fresh timestamp, made
  with the private key given by ``--auth-supernode-private-key``. Flower 1.41
  reads that private key with ``load_ssh_private_key`` and the public key with
  ``load_ssh_public_key`` and accepts only NIST elliptic curves, so both halves
  are written in OpenSSH format on P-384.

Everything is generated in memory by pure functions
(:func:`generate_credentials`); :func:`write_credentials` is the only one that
touches the disk.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from privfed.errors import PrivfedError

DEFAULT_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
"""Names always put in the SuperLink certificate.

The SuperLink starts its own ServerApp executor against ``127.0.0.1`` (or
``::1``) even when it listens on ``0.0.0.0``, so these must always verify.
"""

DEFAULT_VALID_DAYS = 365
CA_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
SUPERLINK_CERT_FILE = "superlink.pem"
SUPERLINK_KEY_FILE = "superlink.key"
DEFAULT_SUPERLINK_PORT = 8000
"""Flower's own default for ``flower-superlink --port`` (Fleet, Control and Runtime APIs)."""

_CLOCK_SKEW = dt.timedelta(minutes=5)
_DNS_NAME = re.compile(r"(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


def supernode_key_file(partition_id: int) -> str:
    """Name of SuperNode ``partition_id``'s private key (its public key adds ``.pub``).

    Keys are numbered like partitions so that the SuperNode started with
    ``partition-id=I`` naturally uses ``supernode-I``.
    """
    return f"supernode-{partition_id}"


def new_private_key() -> ec.EllipticCurvePrivateKey:
    """A fresh P-384 key: a NIST curve, as Flower's node authentication requires."""
    return ec.generate_private_key(ec.SECP384R1())


def subject_alternative_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """SAN entries for ``hosts``: IP addresses as such, everything else as DNS names.

    Clients match the address they dialled against the SAN list (the common
    name is ignored), so an IP must appear as an ``IPAddress`` entry, never as
    a DNS name. Duplicates (e.g. a user repeating ``localhost``) are dropped.

    Raises:
        PrivfedError: A host that is neither an IP nor a DNS name, typically
            ``host:port`` or a URL, which would yield a certificate no client
            can match.
    """
    names: list[x509.GeneralName] = []
    seen: set[str] = set()
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
            key = "dns:" + host.lower()
            entry: x509.GeneralName = x509.DNSName(host)
        else:
            key = "ip:" + str(ip)
            entry = x509.IPAddress(ip)
        if key not in seen:
            seen.add(key)
            names.append(entry)
    return names


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "privfed"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )



def _key_usage(**allowed: bool) -> x509.KeyUsage:
    """An EC key's usages: digital signatures plus ``allowed``; everything else off."""
    flags = dict.fromkeys(
        ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
         "key_cert_sign", "crl_sign", "encipher_only", "decipher_only"),
        False,
    )
    return x509.KeyUsage(digital_signature=True, **{**flags, **allowed})

def make_ca(
    *, valid_days: int = DEFAULT_VALID_DAYS, now: dt.datetime | None = None
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA that may only sign end-entity certificates.

    ``path_length=0`` stops a leaked server key from being used to mint
    further CAs. The validity starts a few minutes in the past so that
    machines whose clocks lag slightly still accept it.
    """
    now = now or dt.datetime.now(dt.UTC)
    key = new_private_key()
    name = _name("privfed federation CA")
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(key_cert_sign=True, crl_sign=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA384())
    )
    return key, cert


def make_server_certificate(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    hosts: Sequence[str],
    *,
    valid_days: int = DEFAULT_VALID_DAYS,
    now: dt.datetime | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The SuperLink's key and a certificate for ``hosts``, signed by the CA.

    The extensions are the ones strict verifiers insist on (SAN, server-auth
    extended key usage, authority key identifier), so the same files work with
    Python's ``ssl``, httpx and gRPC alike.

    Raises:
        PrivfedError: ``hosts`` yields no usable name.
    """
    sans = subject_alternative_names(hosts)
    if not sans:
        raise PrivfedError("the SuperLink certificate needs at least one host name or IP address")
    now = now or dt.datetime.now(dt.UTC)
    key = new_private_key()
    public = key.public_key()
    first = sans[0].value
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"privfed SuperLink {first}"))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(key_agreement=True),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA384())
    )
    return key, cert


def supernode_key_pair(comment: str = "") -> tuple[bytes, bytes]:
    """One SuperNode's authentication keys: (OpenSSH private key, OpenSSH public key line).

    The private key stays on the SuperNode; the public line is what the
    operator registers with ``flwr supernode register``. The private key is
    unencrypted because ``flower-supernode`` loads it without a passphrase.
    ``comment`` (e.g. the key's file name) is appended to the public line to
    tell registered keys apart.
    """
    key = new_private_key()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    if comment:
        public += b" " + comment.encode("ascii")
    return private, public + b"\n"


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


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


def generate_credentials(
    num_supernodes: int,
    hosts: Iterable[str] = (),
    *,
    valid_days: int = DEFAULT_VALID_DAYS,
    now: dt.datetime | None = None,
) -> Credentials:
    """A CA, a SuperLink certificate for :data:`DEFAULT_HOSTS` + ``hosts``, and node keys.

    Args:
        num_supernodes: How many SuperNode key pairs to make (one per partition).
        hosts: Extra names or IPs the SuperNodes and the ``flwr`` CLI will dial.
        valid_days: Lifetime of both certificates.
        now: Start of validity (tests pin it; default: the current time).

    Raises:
        PrivfedError: A count or lifetime that cannot be right.
    """
    if num_supernodes < 0:
        raise PrivfedError(f"the number of SuperNodes must be >= 0, got {num_supernodes}")
    if valid_days < 1:
        raise PrivfedError(f"certificates must be valid for at least one day, got {valid_days}")
    all_hosts = tuple(dict.fromkeys([*DEFAULT_HOSTS, *(h.strip() for h in hosts if h.strip())]))
    ca_key, ca_cert = make_ca(valid_days=valid_days, now=now)
    server_key, server_cert = make_server_certificate(
        ca_key, ca_cert, all_hosts, valid_days=valid_days, now=now
    )
    pairs = [supernode_key_pair(supernode_key_file(i)) for i in range(num_supernodes)]
    return Credentials(
        ca_certificate=ca_cert.public_bytes(serialization.Encoding.PEM),
        ca_key=_pem_key(ca_key),
        superlink_certificate=server_cert.public_bytes(serialization.Encoding.PEM),
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

    @classmethod
    def in_directory(cls, directory: Path, num_supernodes: int) -> CredentialPaths:
        """The fixed layout inside ``directory``, so other tools can find the files."""
        directory = Path(directory).expanduser().resolve()
        keys = tuple(directory / supernode_key_file(i) for i in range(num_supernodes))
        return cls(
            directory=directory,
            ca_certificate=directory / CA_FILE,
            ca_key=directory / CA_KEY_FILE,
            superlink_certificate=directory / SUPERLINK_CERT_FILE,
            superlink_key=directory / SUPERLINK_KEY_FILE,
            supernode_keys=keys,
            supernode_public_keys=tuple(k.with_name(k.name + ".pub") for k in keys),
        )

    def private_files(self) -> tuple[Path, ...]:
        """Files that must stay readable by their owner only."""
        return (self.ca_key, self.superlink_key, *self.supernode_keys)

    def all_files(self) -> tuple[Path, ...]:
        """Every file, in the order they are reported to the user."""
        return (
            self.ca_certificate,
            self.ca_key,
            self.superlink_certificate,
            self.superlink_key,
            *[f for pair in zip(self.supernode_keys, self.supernode_public_keys) for f in pair],
        )


def _write(path: Path, data: bytes, private: bool) -> None:
    """Create ``path`` with its final permissions from the start.

    Opening with mode 0600 (instead of chmod after writing) means a private
    key is never readable by others, not even for an instant. An existing
    file (only reached with ``force``) is removed first so that the new
    file's mode, not the old one's, applies.
    """
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    if private:
        os.chmod(path, 0o600)  # the umask can only remove bits; make the mode exact


def write_credentials(credentials: Credentials, directory: Path, *, force: bool = False) -> CredentialPaths:
    """Write ``credentials`` into ``directory``; private keys with mode 0600.

    Nothing is written unless every file can be: with existing files and no
    ``force`` the call fails before touching the disk, so a half-replaced set
    (a new CA next to a server certificate signed by the old one) cannot
    happen by accident.

    Raises:
        PrivfedError: Some files exist and ``force`` is false.
    """
    paths = CredentialPaths.in_directory(directory, len(credentials.supernode_keys))
    existing = [p for p in paths.all_files() if p.exists()]
    if existing and not force:
        names = ", ".join(str(p) for p in existing)
        raise PrivfedError(f"refusing to overwrite existing files ({names}); use --force to replace them")
    paths.directory.mkdir(parents=True, exist_ok=True)
    _write(paths.ca_certificate, credentials.ca_certificate, private=False)
    _write(paths.ca_key, credentials.ca_key, private=True)
    _write(paths.superlink_certificate, credentials.superlink_certificate, private=False)
    _write(paths.superlink_key, credentials.superlink_key, private=True)
    for key_path, pub_path, key, pub in zip(
        paths.supernode_keys, paths.supernode_public_keys, credentials.supernode_keys, credentials.supernode_public_keys
    ):
        _write(key_path, key, private=True)
        _write(pub_path, pub, private=False)
    return paths


def next_steps(paths: CredentialPaths, *, superlink_host: str = "127.0.0.1", port: int = DEFAULT_SUPERLINK_PORT) -> str:
    """The commands that use the files just written, for the user to copy.

    They are the ones docs/deployment.md walks through; printing them with
    the real paths filled in saves a round of editing.
    """
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
        lines += ["", "4. Start one SuperNode per partition (each on its own machine, or with its own --port):"]
        for i, key in enumerate(paths.supernode_keys):
            lines += [
                f"   flower-supernode --superlink {address} --root-certificates {paths.ca_certificate} \\",
                f"     --auth-supernode-private-key {key} --port {9094 + i} \\",
                f'     --node-config "partition-id={i} num-partitions={num}"',
            ]
    step = 5 if num else 3
    lines += [
        "",
        f"{step}. Run the app (num-clients must equal the number of SuperNodes; out must be absolute):",
        f"   flwr run . privfed --run-config \"num-clients={num or 'N'} participation=1.0 out='/abs/path/run'\" --stream",
        "",
        f"Only {paths.ca_certificate.name} and each SuperNode's own key go to other machines; "
        f"keep {paths.ca_key.name} and {paths.superlink_key.name} on the SuperLink host.",
    ]
    return "\n".join(lines)
