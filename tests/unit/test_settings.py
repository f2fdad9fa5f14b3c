from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.errors import ConfigError
from shared.settings import KafkaSettings, RedisSettings, ServiceSettings, load_settings


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("AISTACK_KAFKA_BOOTSTRAP", "no-port-here", "AISTACK_KAFKA_BOOTSTRAP"),
        ("AISTACK_KAFKA_TOPIC_PARTITIONS", "many", "AISTACK_KAFKA_TOPIC_PARTITIONS"),
        ("AISTACK_KAFKA_SECURITY_PROTOCOL", "CARRIER_PIGEON", "AISTACK_KAFKA_SECURITY_PROTOCOL"),
        ("AISTACK_REDIS_URL", "http://localhost", "AISTACK_REDIS_URL"),
        ("AISTACK_LOG_LEVEL", "chatty", "AISTACK_LOG_LEVEL"),
        ("AISTACK_KAFKA_SSL_CAFILE", "/no/such/ca.pem", "AISTACK_KAFKA_SSL_CAFILE"),
    ],
)
def test_bad_setting_names_the_variable_in_one_line(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, named: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings(ServiceSettings)
    message = str(caught.value)
    assert named in message
    assert "\n" not in message


def test_sasl_needs_its_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AISTACK_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("AISTACK_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    with pytest.raises(ConfigError, match="AISTACK_KAFKA_SASL_USERNAME"):
        load_settings(KafkaSettings)


def test_security_settings_pass_through_to_both_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AISTACK_KAFKA_BOOTSTRAP", "broker-1:9093, broker-2:9093")
    monkeypatch.setenv("AISTACK_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("AISTACK_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("AISTACK_KAFKA_SASL_USERNAME", "svc")
    monkeypatch.setenv("AISTACK_KAFKA_SASL_PASSWORD", "s3cret")
    kafka = load_settings(KafkaSettings)
    assert "s3cret" not in repr(kafka)
    assert kafka.client_config() == {
        "bootstrap.servers": "broker-1:9093,broker-2:9093",
        "client.id": "aistack",
        "security.protocol": "SASL_PLAINTEXT",
        "reconnect.backoff.max.ms": 1000,
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "svc",
        "sasl.password": "s3cret",
    }
    aio = kafka.aiokafka_config()
    assert aio["sasl_plain_password"] == "s3cret"
    assert aio["security_protocol"] == "SASL_PLAINTEXT"


def test_settings_are_frozen() -> None:
    settings = ServiceSettings()
    with pytest.raises(ValidationError, match="frozen"):
        settings.kafka.bootstrap = "elsewhere:9092"  # type: ignore[misc]
    assert RedisSettings().url == "redis://localhost:6379/0"
    assert KafkaSettings().bootstrap == "localhost:9092"


@pytest.mark.parametrize("mechanism", ["OAUTHBEARER", "GSSAPI", "gssapi"])
def test_a_sasl_mechanism_no_client_is_wired_for_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, mechanism: str
) -> None:
    monkeypatch.setenv("AISTACK_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("AISTACK_KAFKA_SASL_MECHANISM", mechanism)
    with pytest.raises(ConfigError) as caught:
        load_settings(KafkaSettings)
    message = str(caught.value)
    assert message.startswith("bad setting AISTACK_KAFKA_SASL_MECHANISM: ")
    assert "not wired" in message and "SCRAM-SHA-512" in message and "\n" not in message


def test_min_insync_replicas_above_the_replication_factor_stops_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AISTACK_KAFKA_TOPIC_MIN_INSYNC_REPLICAS", "2")
    with pytest.raises(ConfigError, match="AISTACK_KAFKA_TOPIC_MIN_INSYNC_REPLICAS"):
        load_settings(KafkaSettings)
    monkeypatch.setenv("AISTACK_KAFKA_TOPIC_REPLICATION_FACTOR", "3")
    assert load_settings(KafkaSettings).topic_min_insync_replicas == 2
