"""Secure mode in compose: docker-compose.secure.yml checked against the code
that fills its ``secrets`` volume (no Docker engine runs here)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from cryptography import x509

from compose.grants import redis_acl
from compose.secure import ADMIN, PRINCIPALS, SecureMaterial
from compose.secure_compose import HOSTS, SECRETS_DIR, container_env, write_material
from compose.secure_config import admin_scram
from shared.settings import KafkaSettings, RedisSettings, load_settings

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "compose" / "docker-compose.yml"
SECURE = ROOT / "compose" / "docker-compose.secure.yml"


def services(path: Path) -> dict[str, dict[str, Any]]:
    loaded: dict[str, dict[str, Any]] = yaml.safe_load(path.read_text())["services"]
    return loaded


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("secrets")
    write_material(directory)
    return directory


def on_volume(secrets: Path, path: str) -> Path:
    """Where a container's /secrets/… path is in the volume's directory here."""
    return secrets / PurePosixPath(path).relative_to(SECRETS_DIR)


def properties(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if "=" in line]
    return dict(line.split("=", 1) for line in lines)


def test_the_broker_config_speaks_sasl_ssl_on_both_listeners_with_its_own_copies(
    secrets: Path,
) -> None:
    material = SecureMaterial(secrets)
    config = properties(secrets / "kafka" / "server.properties")
    assert config["listener.security.protocol.map"] == (
        "INTERNAL:SASL_SSL,EXTERNAL:SASL_SSL,CONTROLLER:SSL"
    )
    admin = material.password(ADMIN).get_secret_value()
    for listener in ("internal", "external"):
        jaas = config[f"listener.name.{listener}.scram-sha-512.sasl.jaas.config"]
        assert f'username="admin" password="{admin}"' in jaas
    assert config["allow.everyone.if.no.acl.found"] == "false"
    # The broker reads its key store and CA from its own directory.
    for key in ("ssl.keystore.location", "ssl.truststore.location"):
        assert Path(config[key]).parent == secrets / "kafka" and Path(config[key]).is_file()
    start = (secrets / "kafka" / "start.sh").read_text()
    assert admin_scram(material) in start and "--ignore-formatted" in start


def test_the_certificate_names_every_container_and_the_secrets_are_private(
    secrets: Path,
) -> None:
    material = SecureMaterial(secrets)
    certificate = x509.load_pem_x509_certificate(material.server_cert.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert set(HOSTS) | {"localhost"} <= set(names.value.get_values_for_type(x509.DNSName))
    for private in (material.credentials, material.tokens, material.ca_key):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o711
    assert stat.S_IMODE(material.ca_cert.stat().st_mode) == 0o644
    acl = (secrets / "redis" / "users.acl").read_text()
    assert acl == redis_acl(material.passwords())


@pytest.mark.parametrize("principal", [p for p in PRINCIPALS if p.startswith("svc_")])
def test_each_service_gets_its_own_credentials_by_the_containers_names(
    secrets: Path, principal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = container_env(secrets, principal)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    kafka, redis_settings = load_settings(KafkaSettings), load_settings(RedisSettings)
    password = SecureMaterial(secrets).password(principal).get_secret_value()
    assert (kafka.bootstrap, kafka.security_protocol, kafka.sasl_username) == (
        "kafka:29092",
        "SASL_SSL",
        principal,
    )
    assert kafka.sasl_password is not None and kafka.sasl_password.get_secret_value() == password
    assert redis_settings.url.startswith("rediss://redis:")
    assert redis_settings.username == principal
    serves_grpc = principal in ("svc_tuner", "svc_model")
    assert any(key.endswith("_TLS_CERT_FILE") for key in env) == serves_grpc
    assert any(key.endswith("_AUTH_TOKEN") for key in env) == serves_grpc


def test_exec_runs_the_service_with_its_principal_read_at_start(secrets: Path) -> None:
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "compose.secure_compose",
            "exec",
            "svc_ingest",
            "--",
            sys.executable,
            "-c",
            "import os; print(os.environ['AISTACK_KAFKA_SASL_USERNAME'])",
        ],
        env={**os.environ, "AISTACK_SECRETS_DIR": str(secrets)},
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert shown.stdout.strip() == "svc_ingest"


def test_every_aistack_service_runs_under_its_own_principal_after_the_grants() -> None:
    base, secure = services(BASE), services(SECURE)
    aistack = [name for name in base if name.startswith("svc_")]
    assert aistack and set(aistack) <= set(secure)
    for name in aistack:
        command = secure[name]["command"]
        wrapper = ["python", "-m", "compose.secure_compose", "exec", name, "--"]
        assert command[: len(wrapper)] == wrapper, name
        assert command[len(wrapper) :] == base[name]["command"], name
        assert secure[name]["depends_on"]["grants"]["condition"] == (
            "service_completed_successfully"
        )
        assert "secrets:/secrets:ro" in secure[name]["volumes"], name
        # The overlay's volume lists replace the base's: nothing is lost.
        assert set(base[name].get("volumes", [])) <= set(secure[name]["volumes"]), name


def test_the_servers_read_only_files_the_secrets_service_writes(secrets: Path) -> None:
    secure = services(SECURE)
    assert secure["secrets"]["command"][-2:] == ["material", str(SECRETS_DIR)]
    assert secure["kafka"]["command"] == ["/secrets/kafka/start.sh"]
    assert on_volume(secrets, secure["kafka"]["command"][0]).is_file()
    redis = secure["redis"]["command"]
    assert redis[redis.index("--port") + 1] == "0"  # TLS only
    for option in ("--tls-cert-file", "--tls-key-file", "--tls-ca-cert-file", "--aclfile"):
        path = redis[redis.index(option) + 1]
        assert path.startswith("/secrets/redis/") and on_volume(secrets, path).is_file(), option
    for name in ("kafka", "redis", "grants"):
        assert any(m.startswith("secrets:/secrets") for m in secure[name]["volumes"]), name
