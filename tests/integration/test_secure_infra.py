"""Secure mode's Kafka and Redis (``aistack infra up --secure``), and what
each refuses: a Kafka client without credentials or with a wrong password, a
principal writing a topic it does not own, a Redis client without its
password or outside its keys. Each refusal is checked where the client sees
it and where the server logs it."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pytest
import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from pydantic import SecretStr

from compose.grants import KAFKA_GRANTS
from compose.local import LocalStack
from compose.settings import InfraSettings
from shared.bus.groups import partition_owners
from shared.bus.topics import EVENTS_CLEAN, TOPICS, TUNING_TRIALS, ensure_topics
from shared.errors import Unavailable
from shared.ports import free_ports
from shared.redis_client import make_redis
from shared.settings import CommonSettings, KafkaSettings
from tests.infra import wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    kafka_port, controller_port, redis_port = free_ports(3)
    stack = LocalStack(
        InfraSettings(
            secure=True,
            kafka_port=kafka_port,
            kafka_controller_port=controller_port,
            redis_port=redis_port,
            common=CommonSettings(state_dir=tmp_path_factory.mktemp("secure")),
        )
    )
    stack.up()
    try:
        ensure_topics(stack.kafka_settings(), TOPICS)
        yield stack
    finally:
        stack.down()


def send(kafka: KafkaSettings | dict[str, object], topic: str) -> KafkaError | None:
    """One record's delivery error (None: delivered), within 10 s."""
    config = kafka.client_config() if isinstance(kafka, KafkaSettings) else kafka
    errors: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": 10_000, "error_cb": lambda error: None})
    producer.produce(topic, b"{}", on_delivery=lambda error, _: errors.append(error))
    producer.flush(15)
    assert len(errors) == 1, "no delivery report"
    return errors[0]


def broker_log_has(stack: LocalStack, text: str) -> bool:
    return text in stack.kafka.log_file.read_text(errors="replace")


def test_the_material_lives_in_the_state_directory_readable_by_its_owner_only(
    secure: LocalStack,
) -> None:
    material = secure.material
    assert material.directory.is_relative_to(secure.root)
    for private in (
        material.ca_key,
        material.server_key,
        material.server_pem,
        material.credentials,
    ):
        assert private.stat().st_mode & 0o077 == 0, private
    kafka = secure.kafka_settings("svc_ingest")
    assert (kafka.security_protocol, kafka.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
    assert "password" not in repr(kafka) or "**" in repr(kafka)
    assert secure.redis_url.startswith("rediss://")


def test_a_kafka_client_without_credentials_is_refused(secure: LocalStack) -> None:
    plain = {"bootstrap.servers": secure.kafka_bootstrap, "socket.timeout.ms": 3000}
    with pytest.raises(KafkaException, match=r"_TRANSPORT|_TIMED_OUT"):
        AdminClient(plain).list_topics(timeout=5)
    # TLS, but no SASL: the broker wants a SASL handshake first.
    tls_only = {
        **plain,
        "security.protocol": "SSL",
        "ssl.ca.location": str(secure.material.ca_cert),
    }
    with pytest.raises(KafkaException):
        AdminClient(tls_only).list_topics(timeout=5)
    wait_until(
        lambda: broker_log_has(secure, "Failed authentication with /127.0.0.1"),
        10,
        "the broker logged no failed authentication",
    )


def test_a_wrong_password_is_refused_and_logged(secure: LocalStack) -> None:
    good = secure.kafka_settings("svc_ingest").client_config()
    wrong = {**good, "sasl.password": "not-the-password"}
    error = send(wrong, EVENTS_CLEAN)
    assert error is not None
    assert error.code() in (
        KafkaError._AUTHENTICATION,
        KafkaError._MSG_TIMED_OUT,
        KafkaError.SASL_AUTHENTICATION_FAILED,
    )
    wait_until(
        lambda: broker_log_has(
            secure,
            "Authentication failed during authentication due to invalid credentials "
            "with SASL mechanism SCRAM-SHA-512",
        ),
        10,
        "the broker logged no invalid credentials",
    )


def test_svc_ingest_may_write_the_clean_topic_and_nobody_else_may(secure: LocalStack) -> None:
    assert send(secure.kafka_settings("svc_ingest"), EVENTS_CLEAN) is None
    others = [principal for principal in KAFKA_GRANTS if principal != "svc_ingest"]
    assert len(others) == 6
    for principal in others:
        error = send(secure.kafka_settings(principal), EVENTS_CLEAN)
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (
            principal,
            error,
        )
    # svc_transform reads the topic, so its write reaches the broker and is
    # denied there; svc_model may not even see the topic.
    for principal, operation, request in (
        ("svc_transform", "WRITE", "Produce"),
        ("svc_model", "DESCRIBE", "Metadata"),
    ):
        wait_until(
            partial(
                broker_log_has,
                secure,
                f"Principal = User:{principal} is Denied operation = {operation} from host = "
                f"127.0.0.1 on resource = Topic:LITERAL:{EVENTS_CLEAN} for request = {request}",
            ),
            10,
            f"the broker logged no denied {operation} of {principal}",
        )


def test_redis_refuses_a_client_without_its_password_or_outside_its_keys(
    secure: LocalStack,
) -> None:
    settings = secure.redis_settings("svc_transform")
    anonymous = settings.model_copy(update={"username": None, "password": None})
    with pytest.raises(redis.AuthenticationError):
        make_redis(anonymous).ping()
    wrong = settings.model_copy(update={"password": SecretStr("not-the-password")})
    with pytest.raises(redis.AuthenticationError, match="invalid username-password pair"):
        make_redis(wrong).ping()
    # Plaintext to the TLS port: no answer a client could take for Redis's.
    host, port = secure.redis_url.removeprefix("rediss://").split("/")[0].split(":")
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host=host, port=int(port), socket_timeout=3).ping()
    # svc_model reads the online features and writes nothing.
    model = make_redis(secure.redis_settings("svc_model"))
    with pytest.raises(redis.exceptions.NoPermissionError):
        model.hset("aistack:features:device-1", "temperature", "1")
    assert make_redis(secure.redis_settings("svc_transform")).hset(
        "aistack:features:device-1", "temperature", "1"
    ) in (0, 1)
    # The server keeps each refusal in its ACL log, which the admin reads.
    admin = make_redis(secure.redis_settings())
    reasons = {(entry["reason"], entry["username"]) for entry in admin.acl_log()}
    assert ("auth", "svc_transform") in reasons
    assert ("command", "svc_model") in reasons


def test_the_tuner_may_describe_the_trainers_group_and_svc_model_may_not(
    secure: LocalStack,
) -> None:
    """The tuner places trials by the trainers' group's assignment."""
    trainer = Consumer(
        {
            **secure.kafka_settings("svc_trainer").client_config(),
            "group.id": "svc_trainer",
            "client.id": "trainer-1",
        }
    )
    trainer.subscribe([TUNING_TRIALS])
    try:
        tuner = AdminClient(secure.kafka_settings("svc_tuner").client_config())

        def described() -> bool:
            trainer.poll(0.2)
            return partition_owners(tuner, "svc_trainer", TUNING_TRIALS) is not None

        wait_until(described, 60, "the trainers' group never settled")
        owners = partition_owners(tuner, "svc_trainer", TUNING_TRIALS)
        assert owners is not None and set(owners.values()) == {"trainer-1"}
        model = AdminClient(secure.kafka_settings("svc_model").client_config())
        with pytest.raises(Unavailable, match="GROUP_AUTHORIZATION_FAILED"):
            partition_owners(model, "svc_trainer", TUNING_TRIALS)
    finally:
        trainer.close()
