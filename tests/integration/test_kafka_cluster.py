"""A three-broker KRaft cluster from the local launcher (``aistack infra up
--brokers 3``): aistack's topics replicated three times with two in sync,
and svc_ingest's exactly-once flow through a kill -9 of a broker."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from shared.bus.topics import TOPICS, ensure_topics
from tests.infra import Infra, local_infra, wait_until
from tests.integration.ingest_worker import Topics, Worker, prepare, publish, read_outputs
from tests.integration.test_ingest import assert_exact, mixed_records

pytestmark = pytest.mark.timeout(420)

BROKERS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Infra]:
    with local_infra(tmp_path_factory.mktemp("cluster"), brokers=BROKERS) as infra:
        yield infra


def replicas_and_in_sync(
    admin: AdminClient, topics: list[str]
) -> dict[tuple[str, int], tuple[int, int]]:
    """(replicas, in-sync replicas) of every partition of ``topics``; a topic
    the answering broker does not know yet shows as (0, 0)."""
    metadata = admin.list_topics(timeout=10)
    found: dict[tuple[str, int], tuple[int, int]] = {}
    for name in topics:
        known = metadata.topics.get(name)
        if known is None or known.error is not None:
            found[(name, -1)] = (0, 0)
            continue
        for partition in known.partitions.values():
            found[(name, partition.id)] = (len(partition.replicas), len(partition.isrs))
    return found


def fully_replicated(admin: AdminClient, topics: list[str]) -> bool:
    return set(replicas_and_in_sync(admin, topics).values()) == {(3, 3)}


def test_aistacks_topics_get_three_replicas_two_in_sync_by_the_clusters_settings(
    cluster: Infra,
) -> None:
    assert (cluster.kafka.topic_replication_factor, cluster.kafka.topic_min_insync_replicas) == (
        3,
        2,
    )
    ensure_topics(cluster.kafka, TOPICS)

    admin = AdminClient(cluster.kafka.client_config())
    names = [spec.name for spec in TOPICS]
    # Every broker learns of a new topic from the controller, one a moment after another.
    wait_until(
        lambda: fully_replicated(admin, names),
        30,
        f"not three in sync everywhere: {replicas_and_in_sync(admin, names)}",
    )
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names]
    # The broker asked may still answer "unknown topic" a moment longer.
    wait_until(lambda: all_described(admin, resources), 30, "the topics' configs not described")
    for future in admin.describe_configs(resources).values():
        assert future.result(timeout=30)["min.insync.replicas"].value == "2"


def all_described(admin: AdminClient, resources: list[ConfigResource]) -> bool:
    try:
        for future in admin.describe_configs(resources).values():
            future.result(timeout=30)
    except KafkaException:
        return False
    return True


def test_a_broker_killed_mid_flow_loses_nothing_doubles_nothing_and_catches_up(
    cluster: Infra, unique: str, tmp_path: Path
) -> None:
    stack = cluster.local_stack
    assert stack is not None
    topics = Topics.unique(unique)
    prepare(cluster, topics)
    records = mixed_records(10_000, seed=31)
    replication = {
        "AISTACK_KAFKA_TOPIC_REPLICATION_FACTOR": "3",
        "AISTACK_KAFKA_TOPIC_MIN_INSYNC_REPLICAS": "2",
    }
    worker = Worker(cluster, topics, tmp_path / "w", extra_env=replication)
    try:
        worker.wait_ready(timeout=120)
        publish(cluster, topics.raw, records)
        wait_until(
            lambda: worker.counter("ingest_records_in_total") >= 3_000,
            90,
            "the worker made no progress before the kill",
        )
        # The broker that coordinates the worker's group: the hardest one to lose.
        victim = stack.brokers[group_coordinator(cluster, topics.app_id) - 1]
        pid = victim.pid()
        assert pid is not None
        signal_kill(pid)

        # With the broker still down, the flow goes on to the last record.
        written = read_outputs(cluster.kafka, topics, expected_total=9_500, timeout=180)
        assert_exact(records, written, [worker])
        assert worker.process.poll() is None
        assert victim.pid() is None

        stack.up()
        admin = AdminClient(cluster.kafka.client_config())
        changelog = f"{topics.app_id}-dedup-changelog"
        names = [topics.raw, topics.clean, topics.dlq, changelog]
        wait_until(
            lambda: fully_replicated(admin, names),
            120,
            f"{victim.name} did not catch up: {replicas_and_in_sync(admin, names)}",
        )
    finally:
        worker.close()


def group_coordinator(infra: Infra, group: str) -> int:
    admin = AdminClient(infra.kafka.client_config())
    (described,) = admin.describe_consumer_groups([group]).values()
    return int(described.result(timeout=30).coordinator.id)


def signal_kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _running(pid), 10, f"broker pid {pid} did not die")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie until the launcher that started it (this process) reaps it.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"
