"""Where the integration tests' Kafka and Redis come from.

In order: servers named by AISTACK_KAFKA_BOOTSTRAP / AISTACK_REDIS_URL;
else testcontainers when a Docker engine answers; else the local launcher
(the embedded default), on free ports with a throw-away state directory.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka import Message as KafkaMessage

from compose.local import LocalStack
from compose.settings import KAFKA_PORT_STEP, InfraSettings
from shared.ports import ephemeral_range, free_ports
from shared.settings import CommonSettings, KafkaSettings, RedisSettings

KAFKA_IMAGE = "confluentinc/cp-kafka:7.9.1"  # Apache Kafka 3.9, as the local launcher
REDIS_IMAGE = "redis:7.4"


@dataclass(frozen=True)
class Infra:
    kind: str  # "external", "testcontainers" or "local"
    kafka: KafkaSettings
    redis: RedisSettings
    # The launcher that started them, when kind is "local".
    local_stack: LocalStack | None = None


def docker_available() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def wait_until(condition: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(message)


def metric_value(port: int, name: str, labels: str = "") -> float:
    """``name{labels}`` from a process's Prometheus ``/metrics``; 0 before it answers."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    wanted = f"{name}{labels} "
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted))


@contextmanager
def provide_infra(state_dir: Path) -> Iterator[Infra]:
    if os.environ.get("AISTACK_KAFKA_BOOTSTRAP") and os.environ.get("AISTACK_REDIS_URL"):
        yield Infra("external", KafkaSettings(), RedisSettings())
    elif docker_available():
        with _containers() as infra:
            yield infra
    else:
        with _local(state_dir) as infra:
            yield infra


@contextmanager
def _containers() -> Iterator[Infra]:
    from testcontainers.community.kafka import KafkaContainer
    from testcontainers.community.redis import RedisContainer

    with ExitStack() as stack:
        kafka = (
            KafkaContainer(KAFKA_IMAGE)
            .with_kraft()
            .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        )
        stack.enter_context(kafka)
        redis = stack.enter_context(RedisContainer(REDIS_IMAGE))
        redis_url = f"redis://{redis.get_container_host_ip()}:{redis.get_exposed_port(6379)}/0"
        yield Infra(
            "testcontainers",
            KafkaSettings(bootstrap=kafka.get_bootstrap_server()),
            RedisSettings(url=redis_url),
        )


@contextmanager
def _local(state_dir: Path) -> Iterator[Infra]:
    with local_infra(state_dir) as infra:
        yield infra


@contextmanager
def local_infra(state_dir: Path, *, brokers: int = 1) -> Iterator[Infra]:
    """The local launcher's Kafka (``brokers`` of them) and Redis on free
    ports; its ``kafka`` settings carry the cluster's topic replication."""
    kafka_port, controller_port, redis_port = stepped_free_ports(3, brokers)
    settings = InfraSettings(
        brokers=brokers,
        kafka_port=kafka_port,
        kafka_controller_port=controller_port,
        redis_port=redis_port,
        common=CommonSettings(state_dir=state_dir),
    )
    stack = LocalStack(settings)
    stack.up()
    try:
        yield Infra(
            "local",
            stack.kafka_settings(),
            RedisSettings(url=stack.redis_url),
            local_stack=stack,
        )
    finally:
        stack.down()


def stepped_free_ports(count: int, brokers: int) -> list[int]:
    """``count`` free ports, each free also at + KAFKA_PORT_STEP·n for every
    further broker n (where a local cluster puts them), and those below the
    kernel's ephemeral range too (see ``shared.ports``: a connection may take
    one there before the broker binds it)."""
    span = ephemeral_range()
    for _ in range(100):
        ports = free_ports(count)
        # Below the range where the picked ones are (they fall back into it
        # only where there is no room below).
        limit = span[0] if span is not None and max(ports) < span[0] else 65536
        others = [p + KAFKA_PORT_STEP * n for p in ports for n in range(1, brokers)]
        if all(p < limit for p in others) and all(port_is_free(p) for p in others):
            return ports
    raise AssertionError(f"no {count} ports free at every step of {brokers} brokers")


def port_is_free(port: int) -> bool:
    """Whether a localhost socket can bind ``port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def read_topic(kafka: KafkaSettings, topic: str, *, wanted: int, timeout: float) -> list[bytes]:
    """Values of ``topic`` from the start, once ``wanted`` arrived (or the time is up)."""
    return [record.value() for record in read_records(kafka, topic, wanted=wanted, timeout=timeout)]


def read_records(
    kafka: KafkaSettings, topic: str, *, wanted: int, timeout: float
) -> list[KafkaMessage]:
    """Records of ``topic`` from the start (key, headers, partition and
    value), once ``wanted`` arrived (or the time is up)."""
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": f"reader-{topic}-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    records: list[KafkaMessage] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and len(records) < wanted:
            records.extend(r for r in consumer.consume(100, timeout=0.5) if not r.error())
    finally:
        consumer.close()
    return records
