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
