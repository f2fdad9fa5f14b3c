"""svc_ingest.output.OutputWriter against a producer that records what it is handed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder

from svc_ingest.output import OutputWriter

PARTITIONS = {0, 1, 2}


class RecordingProducer:
    """aiokafka's producer as OutputWriter uses it: small batches (a few
    records each), every ``send_batch`` recorded as the producer saw it."""

    def __init__(self) -> None:
        cluster = SimpleNamespace(
            partitions_for_topic=lambda topic: PARTITIONS,
            available_partitions_for_topic=lambda topic: PARTITIONS,
        )
        self.client = SimpleNamespace(cluster=cluster, _wait_on_metadata=self._metadata)
        self._partitioner = DefaultPartitioner()
        self.sent: list[tuple[str, int, int, bool]] = []

    @staticmethod
    async def _metadata(topic: str) -> set[int]:
        return PARTITIONS

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(1024, 0)

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> Any:
        self.sent.append((topic, partition, batch.record_count(), batch.closed()))
        done = asyncio.get_running_loop().create_future()
        done.set_result(SimpleNamespace(topic=topic, partition=partition, offset=0))
        return done


def test_every_batch_goes_to_the_producer_closed_and_every_record_in_one() -> None:
    """An open builder waits out the producer's linger in it for records that
    never come; the writer hands over only closed ones, full or last."""
    producer = RecordingProducer()
    app: Any = SimpleNamespace(producer=SimpleNamespace(_ensure_producer=lambda: producer))
    writer = OutputWriter(app, "raw", exactly_once=False)

    async def one_batch() -> None:
        await writer.use_partitions({0}, ["clean"])
        for i in range(60):
            writer.add(0, "clean", f"device-{i % 5}".encode(), b"v" * 100, [("id", b"%032x" % i)])
        await writer.flush()

    asyncio.run(one_batch())

    assert sum(count for _, _, count, _ in producer.sent) == 60
    assert len(producer.sent) > len(PARTITIONS)  # full builders went too, not only the last
    assert all(closed for _, _, _, closed in producer.sent)


def exactly_once_app(producers: dict[int, RecordingProducer]) -> Any:
    """An app whose source partitions' transactions are ``producers`` (looked
    up afresh each batch, as a rebalance may change them)."""
    default = RecordingProducer()
    return SimpleNamespace(
        producer=SimpleNamespace(
            _ensure_producer=lambda: default,
            _transaction_producers=SimpleNamespace(
                get=lambda tid: producers.get(int(tid.rsplit("-", 1)[1]))
            ),
        ),
        assignor=SimpleNamespace(group_for_topic=lambda topic: 0),
        conf=SimpleNamespace(id="app"),
    )


def test_a_partition_given_back_with_another_transaction_sends_through_the_new_one() -> None:
    """The writer keeps its open batches from batch to batch, but never past a
    change of a source partition's producer (a rebalance took the partition
    and gave it back): the records go out in the transaction of their batch."""
    before, after = RecordingProducer(), RecordingProducer()
    producers = {0: before}
    writer = OutputWriter(exactly_once_app(producers), "raw", exactly_once=True)

    async def one_batch(records: int) -> None:
        await writer.use_partitions({0}, ["clean"])
        for i in range(records):
            writer.add(0, "clean", f"device-{i % 3}".encode(), b"v", [])
        await writer.flush()

    asyncio.run(one_batch(3))
    producers[0] = after
    asyncio.run(one_batch(4))

    assert sum(count for _, _, count, _ in before.sent) == 3
    assert sum(count for _, _, count, _ in after.sent) == 4


def test_what_a_batch_given_up_added_is_not_sent_with_the_next() -> None:
    producer = RecordingProducer()
    app: Any = SimpleNamespace(producer=SimpleNamespace(_ensure_producer=lambda: producer))
    writer = OutputWriter(app, "raw", exactly_once=False)

    async def batches() -> None:
        await writer.use_partitions({0}, ["clean"])
        for _ in range(30):  # full builders among them
            writer.add(0, "clean", b"device", b"v" * 100, [])
        # given up: the next batch starts without flushing this one
        await writer.use_partitions({0}, ["clean"])
        writer.add(0, "clean", b"device", b"w", [])
        await writer.flush()

    asyncio.run(batches())
    assert [count for _, _, count, _ in producer.sent] == [1]
