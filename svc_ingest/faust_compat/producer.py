"""The producers behind Faust's ``app.producer``, reached through its privates.

Under exactly_once Faust's TransactionManager keeps one transactional
aiokafka producer per source partition, id ``{app}-{group}-{partition}``;
svc_ingest sends each record through the one of its raw record's partition
(``svc_ingest.output`` says why). ``Producer`` commits those transactions
side by side.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, cast

from aiokafka import AIOKafkaProducer
from aiokafka.errors import UnknownTopicOrPartitionError
from aiokafka.producer.message_accumulator import BatchBuilder
from faust.transport.drivers import aiokafka as _aiokafka
from faust.types import TP, AppT

__all__ = [
    "BatchSlot",
    "Producer",
    "default_producer",
    "partition_for",
    "transaction_producer",
    "wait_for_topic",
]


class Producer(_aiokafka.Producer):
    """Faust's producer, committing the source partitions' transactions
    concurrently.

    Faust commits them one after another, each with its round trips to the
    transaction coordinator (AddOffsetsToTxn, TxnOffsetCommit, EndTxn, then
    the next begun), while the batch gate keeps the worker's next batch
    waiting. Each partition's transaction is its own (its own producer and
    id), so committing them side by side commits the same things: each under
    its own lock, as Faust's; every commit runs to its end; then the first
    failure, if any, is raised, as Faust's loop would have raised it (the
    commits it would not have reached may have succeeded: each stands alone,
    with its partition's outputs and offsets)."""

    async def commit_transactions(
        self,
        tid_to_offset_map: Mapping[str, Mapping[TP, int]],
        group_id: str,
        start_new_transaction: bool = True,
    ) -> None:
        results = await asyncio.gather(
            *(
                self._commit_one(transactional_id, offsets, group_id, start_new_transaction)
                for transactional_id, offsets in tid_to_offset_map.items()
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _commit_one(
        self,
        transactional_id: str,
        offsets: Mapping[TP, int],
        group_id: str,
        start_new_transaction: bool,
    ) -> None:
        # Faust's own loop body, for one transactional id.
        await super().commit_transactions(
            {transactional_id: offsets}, group_id, start_new_transaction
        )


def default_producer(app: AppT) -> AIOKafkaProducer:
    """The app's plain (non-transactional) aiokafka producer, started."""
    producer: Any = app.producer
    found: AIOKafkaProducer = producer._ensure_producer()
    return found


def transaction_producer(app: AppT, source_topic: str, partition: int) -> AIOKafkaProducer | None:
    """The open transaction's producer of ``source_topic``'s ``partition``; None
    when this worker does not own the partition (any more)."""
    producer: Any = app.producer
    group = app.assignor.group_for_topic(source_topic)
    found: AIOKafkaProducer | None = producer._transaction_producers.get(
        f"{app.conf.id}-{group}-{partition}"
    )
    return found


async def wait_for_topic(producer: AIOKafkaProducer, topic: str, timeout: float = 60.0) -> int:
    """Until the producer's client holds ``topic``'s partitions; their count.

    aiokafka's own wait ends once the topic is in its metadata at all; on a
    cluster, a broker that has only just heard of a new topic lists it with
    no partitions."""
    client = producer.client
    deadline = time.monotonic() + timeout
    while not (partitions := await client._wait_on_metadata(topic)):
        if time.monotonic() > deadline:
            raise UnknownTopicOrPartitionError(f"{topic} has no partitions after {timeout:.0f} s")
        await asyncio.sleep(0.1)
        await client.force_metadata_update()
    return len(partitions)


def partition_for(producer: AIOKafkaProducer, topic: str, key: bytes | None, known: int) -> int:
    """The partition ``producer.send`` would choose for ``key`` (the default
    partitioner: murmur2 of the key over every partition, as Java's).

    ``known`` is the partition count ``wait_for_topic`` found: a later
    metadata answer from a broker that lags the others may list none for a
    while (the key's partition does not change because of it); a count that
    grew is taken from the metadata."""
    cluster = producer.client.cluster
    count = max(known, len(cluster.partitions_for_topic(topic) or ()))
    every = list(range(count))
    available = sorted(cluster.available_partitions_for_topic(topic) or ()) or every
    return int(producer._partitioner(key, every, available))


class BatchSlot:
    """The open batch of one (producer, topic, partition), filled through its
    compiled record builder: ``append(count, None, key, value, headers)`` is
    the builder's own ``append`` (offset, timestamp, key, value, headers),
    which returns None when the batch is full (or, empty, when one record
    is larger than a batch). aiokafka's ``BatchBuilder.append`` wraps that in
    a Python call with keywords, a serializer call and a closed check, which
    a record paid on svc_ingest's hot path; a slot's producer has no
    serializers (svc_ingest sends bytes), so the wrapper added nothing.

    ``count``: the records appended to the open batch, which the caller
    counts up after each append that did not return None.
    """

    __slots__ = ("_builder", "append", "count", "partition", "producer", "topic")

    def __init__(self, producer: AIOKafkaProducer, topic: str, partition: int) -> None:
        self.producer = producer
        self.topic = topic
        self.partition = partition
        self._open()

    def _open(self) -> None:
        builder: Any = self.producer.create_batch()
        if builder._key_serializer is not None or builder._value_serializer is not None:
            raise TypeError("a BatchSlot's producer must not serialize: it is handed bytes")
        self._builder = builder
        self.append = builder._builder.append
        self.count = 0

    def take(self) -> BatchBuilder:
        """The open batch, closed for ``send_batch`` with its record count,
        and a new empty one open in its place."""
        builder: Any = self._builder
        builder._relative_offset = self.count  # what record_count() reports
        builder.close()
        self._open()
        return cast(BatchBuilder, builder)

    def discard(self) -> None:
        """Drop what the open batch holds: a new empty one in its place."""
        if self.count:
            self._open()
