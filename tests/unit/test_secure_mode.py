"""Secure mode's material (compose/secure.py) and who may do what (compose/grants.py)."""

from __future__ import annotations

import json
from pathlib import Path

from confluent_kafka.admin import AclOperation, ResourceType
from cryptography import x509

from compose.grants import KAFKA_GRANTS, REDIS_RULES, acl_bindings, redis_acl
from compose.secure import ADMIN, PRINCIPALS, ensure_material
from shared.bus.topics import EVENTS_CLEAN, TOPICS


def subject_alternative_names(certificate: Path) -> set[str]:
    loaded = x509.load_pem_x509_certificate(certificate.read_bytes())
    names = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n) for n in names.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in names.get_values_for_type(x509.IPAddress)
    }


def test_the_material_is_made_once_private_and_kept(tmp_path: Path) -> None:
    material = ensure_material(tmp_path / "secure", ["127.0.0.1"])

    assert (tmp_path / "secure").stat().st_mode & 0o777 == 0o700
    for private in (
        material.ca_key,
        material.server_key,
        material.server_pem,
        material.credentials,
    ):
        assert private.stat().st_mode & 0o777 == 0o600, private
    assert set(material.passwords()) == set(PRINCIPALS)
    assert len({p.get_secret_value() for p in material.passwords().values()}) == len(PRINCIPALS)
    assert subject_alternative_names(material.server_cert) == {"localhost", "127.0.0.1"}
    ca = material.ca_cert.read_bytes()
    server = x509.load_pem_x509_certificate(material.server_cert.read_bytes())
    server.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    # The PEM key store Kafka reads: the key, then the certificate.
    assert material.server_pem.read_bytes() == (
        material.server_key.read_bytes() + material.server_cert.read_bytes()
    )

    again = ensure_material(tmp_path / "secure", ["127.0.0.1"])
    assert again.ca_cert.read_bytes() == ca
    assert again.passwords() == material.passwords()


def test_a_new_host_gets_a_new_server_certificate_from_the_same_ca(tmp_path: Path) -> None:
    first = ensure_material(tmp_path, ["127.0.0.1"])
    ca, passwords = first.ca_cert.read_bytes(), first.passwords()

    second = ensure_material(tmp_path, ["10.1.2.3", "broker.example"])

    assert subject_alternative_names(second.server_cert) >= {"10.1.2.3", "broker.example"}
    assert second.ca_cert.read_bytes() == ca
    assert second.passwords() == passwords


def test_a_principal_missing_from_an_older_state_gets_a_password_the_rest_keep_theirs(
    tmp_path: Path,
) -> None:
    material = ensure_material(tmp_path, [])
    stored = json.loads(material.credentials.read_text())
    del stored["svc_monitor"]
    material.credentials.write_text(json.dumps(stored))

    again = ensure_material(tmp_path, [])

    assert set(again.passwords()) == set(PRINCIPALS)
    assert again.password("svc_ingest") == material.password("svc_ingest")


def writers_of(topic: str) -> set[str]:
    return {
        principal
        for principal, grants in KAFKA_GRANTS.items()
        for grant in grants
        if grant.resource == ResourceType.TOPIC
        and grant.name == topic
        and AclOperation.WRITE in grant.operations
    }


def test_svc_ingest_alone_writes_the_clean_topic_and_every_topic_has_a_writer() -> None:
    assert writers_of(EVENTS_CLEAN) == {"svc_ingest"}
    assert all(writers_of(spec.name) for spec in TOPICS)
    assert set(KAFKA_GRANTS) | {ADMIN} == set(PRINCIPALS)


def test_each_binding_is_there_once() -> None:
    bindings = acl_bindings()
    keys = [
        (b.principal, b.restype, b.name, b.resource_pattern_type, b.operation) for b in bindings
    ]
    assert len(keys) == len(set(keys))
    assert all(b.principal.startswith("User:") and b.host == "*" for b in bindings)


def test_redis_default_user_is_off_and_each_user_has_its_password(tmp_path: Path) -> None:
    passwords = ensure_material(tmp_path, []).passwords()
    lines = redis_acl(passwords).splitlines()
    assert lines[0].startswith("user default off")
    assert len(lines) == 1 + len(REDIS_RULES)
    for principal, rules in REDIS_RULES.items():
        password = passwords[principal].get_secret_value()
        assert f"user {principal} on >{password} {rules}" in lines
    # Services that never touch Redis have no user there at all.
    assert not any(line.startswith(("user svc_ingest", "user svc_trainer")) for line in lines)
