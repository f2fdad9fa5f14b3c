from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from shared.bus.topics import TOPICS, TopicSpec, ensure_topics
from tests.infra import Infra

pytestmark = pytest.mark.integration


def describe(infra: Infra, name: str) -> tuple[int, str]:
    admin = AdminClient(infra.kafka.client_config())
    partitions = len(admin.list_topics(name, timeout=10).topics[name].partitions)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    config = admin.describe_configs([resource])[resource].result()
    return partitions, config["cleanup.policy"].value


def test_ensure_topics_is_idempotent_with_partitions_and_compaction(
    infra: Infra, unique: str
) -> None:
    specs = [TopicSpec(f"{s.name}.{unique}", s.message_type, s.compacted, s.config) for s in TOPICS]
    first = ensure_topics(infra.kafka, specs, partitions=3)
    assert set(first.values()) == {"created"}
    again = ensure_topics(infra.kafka, specs, partitions=3)
    assert set(again.values()) == {"exists"}
    for spec in specs:
        partitions, policy = describe(infra, spec.name)
        assert partitions == 3
        assert policy == ("compact" if spec.compacted else "delete")


def test_ensure_topics_brings_an_existing_topic_to_the_spec(infra: Infra, unique: str) -> None:
    name = f"test.reconcile.{unique}"
    ensure_topics(infra.kafka, [TopicSpec(name, None)], partitions=1)
    assert describe(infra, name) == (1, "delete")
    outcome = ensure_topics(infra.kafka, [TopicSpec(name, None, compacted=True)], partitions=4)
    assert outcome == {name: "updated"}
    assert describe(infra, name) == (4, "compact")


def min_insync(infra: Infra, name: str) -> str:
    admin = AdminClient(infra.kafka.client_config())
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    value: str = admin.describe_configs([resource])[resource].result()["min.insync.replicas"].value
    return value


def test_min_insync_replicas_is_set_and_never_above_a_topics_replicas(
    infra: Infra, unique: str
) -> None:
    name = f"test.insync.{unique}"
    assert ensure_topics(infra.kafka, [TopicSpec(name, None)], partitions=1) == {name: "created"}
    assert min_insync(infra, name) == "1"
    # Settings for a three-broker cluster meet a topic of one replica (made before they
    # grew): it keeps a minimum it can meet, so acks=all writes still succeed.
    cluster = infra.kafka.model_copy(
        update={"topic_replication_factor": 3, "topic_min_insync_replicas": 2}
    )
    assert ensure_topics(cluster, [TopicSpec(name, None)], partitions=1) == {name: "exists"}
    assert min_insync(infra, name) == "1"
    producer = Producer({**infra.kafka.client_config(), "acks": "all"})
    producer.produce(name, b"written")
    assert producer.flush(10) == 0
