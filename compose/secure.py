"""Secure mode's material, generated into the state directory on first start.

A certificate authority, one certificate for the servers (Kafka's brokers
and controllers, Redis, the gRPC servers), one password per principal
(Kafka's SCRAM users and Redis's ACL users share the names in
:data:`PRINCIPALS`), and the gRPC servers' bearer tokens. Made by
the ``cryptography`` library, never by shelling out to openssl; never into
the checkout. Keys and passwords are readable by their owner only.

What is there is kept: a second start finds the same CA and passwords (the
broker formatted with them), and only adds what is missing, e.g. a principal
a newer version names.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pydantic import SecretStr

#: The launcher's own principal (Kafka's super user, the broker-to-broker one).
ADMIN = "admin"

#: Every principal secure mode makes a password for: the admin, one per
#: service, and ``client``, the user's CLI and client (produces raw events,
#: calls nothing it does not own).
PRINCIPALS: tuple[str, ...] = (
    ADMIN,
    "svc_ingest",
    "svc_transform",
    "svc_tuner",
    "svc_trainer",
    "svc_model",
    "svc_monitor",
    "client",
)

#: The gRPC servers whose callers must send a bearer token in secure mode.
TOKEN_HOLDERS: tuple[str, ...] = ("svc_tuner", "svc_model")

#: The servers' certificate's subject; a controller listener requires it of
#: the brokers that connect (mutual TLS), and Kafka names it ``User:CN=…``.
SERVER_COMMON_NAME = "aistack-broker"

_CA_DAYS = 3650
_SERVER_DAYS = 825
_PRIVATE = 0o600


@dataclass(frozen=True)
class SecureMaterial:
    """Where secure mode's files are, and the passwords in them."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    @property
    def server_pem(self) -> Path:
        """Key and certificate in one file: Kafka's PEM key store."""
        return self.directory / "server.pem"

    @property
    def credentials(self) -> Path:
        return self.directory / "credentials.json"

    @property
    def tokens(self) -> Path:
        return self.directory / "tokens.json"

    def token(self, server: str) -> SecretStr:
        """The bearer token of ``server`` (one of ``TOKEN_HOLDERS``)."""
        stored: dict[str, str] = json.loads(self.tokens.read_text())
        return SecretStr(stored[server])

    def password(self, principal: str) -> SecretStr:
        """``principal``'s password; KeyError for a name not in ``PRINCIPALS``."""
        return self.passwords()[principal]

    def passwords(self) -> dict[str, SecretStr]:
        stored: dict[str, str] = json.loads(self.credentials.read_text())
        return {name: SecretStr(value) for name, value in stored.items()}


def ensure_material(directory: Path, hosts: Iterable[str]) -> SecureMaterial:
    """The material in ``directory``, made where missing; the server
    certificate covers localhost, 127.0.0.1 and ``hosts``."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    material = SecureMaterial(directory)
    names = sorted({"localhost", "127.0.0.1", *hosts})
    if not (material.ca_cert.exists() and material.ca_key.exists()):
        _write_ca(material)
    if not material.server_pem.exists() or not _covers(material.server_cert, names):
        _write_server_certificate(material, names)
    _ensure_passwords(material)
    return material


def _write_ca(material: SecureMaterial) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aistack local CA")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    write_private(material.ca_key, _key_bytes(key))
    material.ca_cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def _write_server_certificate(material: SecureMaterial, names: list[str]) -> None:
    ca_key = serialization.load_pem_private_key(material.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate(material.ca_cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_COMMON_NAME)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_SERVER_DAYS))
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), False)
        # Servers, and clients too: a broker connects to the controllers with it.
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key_bytes = _key_bytes(key)
    cert_bytes = certificate.public_bytes(serialization.Encoding.PEM)
    write_private(material.server_key, key_bytes)
    material.server_cert.write_bytes(cert_bytes)
    write_private(material.server_pem, key_bytes + cert_bytes)


def _covers(certificate_file: Path, names: list[str]) -> bool:
    if not certificate_file.exists():
        return False
    certificate = x509.load_pem_x509_certificate(certificate_file.read_bytes())
    found = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    covered = {str(n) for n in found.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in found.get_values_for_type(x509.IPAddress)
    }
    return set(names) <= covered


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _ensure_passwords(material: SecureMaterial) -> None:
    _ensure_secrets(material.credentials, PRINCIPALS)
    _ensure_secrets(material.tokens, TOKEN_HOLDERS)


def _ensure_secrets(path: Path, names: Iterable[str]) -> None:
    stored: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    missing = [name for name in names if name not in stored]
    if missing or not path.exists():
        # URL-safe characters only: they go into JAAS lines and Redis URLs as they are.
        stored.update({name: secrets.token_urlsafe(24) for name in missing})
        write_private(path, json.dumps(stored, indent=2).encode())


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    # Unencrypted PKCS#8: what Kafka's PEM key store and Redis both read.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only, from the first byte."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _PRIVATE)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
