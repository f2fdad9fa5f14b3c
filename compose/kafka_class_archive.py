"""A class-data-sharing archive of the Kafka broker's JVM: a broker started
or restarted by the local launcher answers sooner (``bench.broker_start``
measures a restart with it against one without).

``ensure`` (``aistack infra fetch``, which ``make setup`` runs) builds one
archive per Kafka, JDK and jar set: it starts a throw-away broker on free
ports with ``-XX:ArchiveClassesAtExit``, makes it serve what the services ask
of a broker (a topic created, transactional writes, a consumer group's
reads and commits) and stops it, and the JVM writes the archive as it exits.
``java_options`` names it to every JVM the launcher starts on Kafka's class
path (shared.class_archive says why a JVM that cannot map it still starts).
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from compose import kafka_dist
from shared.class_archive import archive_digest, jars_stamp, java_stamp
from shared.errors import ConfigError

if TYPE_CHECKING:
    from compose.settings import InfraSettings

#: The most a build's broker may take to start, serve and stop.
BUILD_TIMEOUT_SECONDS = 120.0
#: Records the warm-up writes and reads back.
WARM_UP_RECORDS = 20


def archive_path(cache_dir: Path) -> Path:
    """Where the archive for this Kafka, this JDK (``java`` on PATH, as the
    launcher starts it) and these jars lives."""
    java = shutil.which("java")
    if java is None:
        raise ConfigError("java not found: Kafka needs a JRE 17")
    libs = kafka_dist.kafka_home(cache_dir) / "libs"
    digest = archive_digest(
        [kafka_dist.KAFKA_VERSION, *java_stamp(Path(java)), str(libs), jars_stamp(libs)]
    )
    return cache_dir / "kafka-class-archive" / f"broker-{digest}.jsa"


def java_options(cache_dir: Path) -> list[str]:
    """The option that maps the archive, where one was built for this set-up."""
    try:
        archive = archive_path(cache_dir)
    except ConfigError:
        return []
    return [f"-XX:SharedArchiveFile={archive}"] if archive.is_file() else []


def ensure(cache_dir: Path) -> Path:
    """The archive, built first when missing. Raises ConfigError when the
    build's broker did not leave one."""
    archive = archive_path(cache_dir)
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
        dumped = Path(tmp) / archive.name
        _warm_up(cache_dir, Path(tmp) / "state", dumped)
        if not dumped.is_file():
            raise ConfigError(f"the broker exited without writing its class archive {dumped}")
        # One archive per cache (each is about 45 MB): the last set-up's.
        for old in archive.parent.glob("broker-*.jsa"):
            old.unlink()
        dumped.rename(archive)
    return archive


def one_broker_settings(cache_dir: Path, state_dir: Path) -> InfraSettings:
    """One plaintext broker on free ports in ``state_dir``, whatever the
    environment's AISTACK_INFRA_* say: a broker of a build's or a benchmark's own."""
    from compose.settings import InfraSettings
    from shared.ports import free_ports
    from shared.settings import CommonSettings

    kafka_port, controller_port = free_ports(2)
    return InfraSettings(
        kafka_port=kafka_port,
        kafka_controller_port=controller_port,
        brokers=1,
        secure=False,
        object_store=False,
        start_timeout=BUILD_TIMEOUT_SECONDS,
        common=CommonSettings(state_dir=state_dir, cache_dir=cache_dir),
    )


def _warm_up(cache_dir: Path, state_dir: Path, dump_to: Path) -> None:
    from compose.local import LocalStack

    stack = LocalStack(
        one_broker_settings(cache_dir, state_dir),
        jvm_options=[f"-XX:ArchiveClassesAtExit={dump_to}"],
    )
    try:
        stack.start_brokers()
        _serve_a_little(stack.kafka_bootstrap)
    finally:
        # SIGTERM: the JVM runs its shutdown and writes the archive as it exits.
        stack.down(timeout=BUILD_TIMEOUT_SECONDS)


def _serve_a_little(bootstrap: str) -> None:
    """What the services ask of a broker, so that those classes are archived
    too: a topic, idempotent transactional writes, a group's reads and commits."""
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"class-archive-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(
        timeout=BUILD_TIMEOUT_SECONDS / 4
    )
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-writer", "linger.ms": 5}
    )
    producer.init_transactions(BUILD_TIMEOUT_SECONDS / 4)
    producer.begin_transaction()
    for i in range(WARM_UP_RECORDS):
        producer.produce(topic, key=str(i % 4).encode(), value=b"warm-up")
    producer.commit_transaction(BUILD_TIMEOUT_SECONDS / 4)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-readers",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.subscribe([topic])
        read = 0
        for _ in range(int(BUILD_TIMEOUT_SECONDS)):
            if read >= WARM_UP_RECORDS:
                break
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                raise KafkaException(message.error())
            read += 1
        if read < WARM_UP_RECORDS:
            raise ConfigError(f"the class archive's warm-up read {read} of {WARM_UP_RECORDS}")
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
