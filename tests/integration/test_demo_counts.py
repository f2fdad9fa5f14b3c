"""The demo counts committed records, not end offsets: a transactional topic
(svc_ingest's clean events) spends an offset on every commit marker, and an
aborted transaction's records are not records at all."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition

from demo.topic_counts import NewRecords
from shared.bus.topics import TopicSpec, ensure_topics
from shared.contracts.aistack.v1 import events_pb2
from tests.infra import Infra


def _transaction(producer: Producer, topic: str, values: list[bytes], *, commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value, partition=0)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)  # on the broker, then aborted
        producer.abort_transaction(30)


def test_the_demo_counts_committed_records_only(infra: Infra, unique: str) -> None:
    topic, dlq = f"demo-counts.{unique}", f"demo-dlq.{unique}"
    ensure_topics(infra.kafka, [TopicSpec(topic, None), TopicSpec(dlq, None)], partitions=1)
    earlier = Producer(infra.kafka.client_config())
    earlier.produce(topic, b"before the counter", partition=0)
    earlier.flush(30)
    producer = Producer(
        {**infra.kafka.client_config(), "transactional.id": f"demo-counts-{unique}"}
    )
    counter = NewRecords(infra.kafka, (topic, dlq), reasons_of=dlq)
    try:
        producer.init_transactions(30)
        _transaction(producer, topic, [b"a", b"b", b"c", b"d"], commit=True)
        _transaction(producer, topic, [b"x", b"y", b"z"], commit=False)
        _transaction(producer, topic, [b"e", b"f"], commit=True)
        letter = events_pb2.DeadLetter(reason="not_json").SerializeToString()
        _transaction(producer, dlq, [letter, letter], commit=True)

        deadline = time.monotonic() + 30
        while counter.update()[topic] < 6 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        counts = counter.update()
    finally:
        counter.close()

    assert counts == {topic: 6, dlq: 2}
    assert counter.reasons == {"not_json": 2}
    # What summing end offsets would have said: every record written, the
    # aborted ones too, and a marker per transaction.
    probe = Consumer(
        {
            **infra.kafka.client_config(),
            "group.id": f"probe-{unique}",
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        _, end = probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    finally:
        probe.close()
    assert end - 1 == 4 + 3 + 2 + 3, end
