"""Where a batch's records go out: each in the transaction of its source partition.

Faust 0.15.3 under ``exactly_once`` keeps one transactional producer per
source partition (id ``{app}-{group}-{partition}``) and, every commit
interval, sends that partition's acked offsets into its transaction and
commits it. Two things in it break exactly-once; this module and the batch
gate (``svc_ingest.faust_compat.consumer.BatchConsumer``, taken by
``svc_ingest.checkpoint.BatchCheckpoint.commit``) avoid both:

* ``TransactionManager.send`` picks the transaction by the *destination*
  partition, so a clean event keyed by entity id lands in another partition's
  transaction (faust-streaming #323, #502). Here every record is sent through
  the producer of the raw record's own partition.
* The periodic commit reads the acked offsets, then waits for each
  transaction's lock: a batch processed meanwhile gets its outputs committed
  with the offsets from before it, and a crash repeats it. The checkpoint
  holds the consumer's batch gate from a batch's first send to its ack, and
  the commit takes the gate before it reads the offsets.

The producers are Faust's; ``svc_ingest.faust_compat.producer`` finds them.

Under ``at_least_once`` the app's plain producer is used: a batch is acked
only after its records are delivered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import faust
from aiokafka import AIOKafkaProducer

from svc_ingest.faust_compat.producer import (
    BatchSlot,
    default_producer,
    partition_for,
    transaction_producer,
    wait_for_topic,
)


class OutputWriter:
    """Collects a batch's records per (transaction, topic, partition) into aiokafka
    batches and sends each batch whole: per record that costs one lookup and
    the compiled append (``BatchSlot``), where ``producer.send`` costs a
    future, a partitioner call and a lookup.

    The slots and which slot a (source partition, topic, key) fills are kept
    from batch to batch while the source partition's producer stays the same
    (an exactly_once transaction's producer changes only with a rebalance)."""

    def __init__(self, app: faust.App, source_topic: str, *, exactly_once: bool) -> None:
        self._app = app
        self._source_topic = source_topic
        self._exactly_once = exactly_once
        self._producers: dict[int, AIOKafkaProducer] = {}
        # (source partition, topic, partition) -> its open batch
        self._slots: dict[tuple[int, str, int], BatchSlot] = {}
        # (source partition, topic, key) -> the slot the key's partition fills
        self._slot_of_key: dict[tuple[int, str, bytes | None], BatchSlot] = {}
        self._oversized: list[tuple[int, str, int, bytes | None, bytes | None, list[Any]]] = []
        self._partition_of: dict[tuple[str, bytes], int] = {}
        # Partition counts of the topics written, as first found.
        self._partition_counts: dict[str, int] = {}
        self._pending_full: list[tuple[AIOKafkaProducer, Any, str, int]] = []
        self._metadata_producer: Any = None

    async def use_partitions(self, partitions: Iterable[int], topics: Iterable[str]) -> None:
        """Look up the transactions of the partitions a batch will send for, and
        the partition counts of the topics it will send to. What was added
        and not flushed (a batch given up) is dropped."""
        self._oversized.clear()
        self._pending_full.clear()
        default = default_producer(self._app)
        # Its client holds the cluster metadata for every topic we write.
        self._metadata_producer = default
        producers: dict[int, AIOKafkaProducer] = {}
        for partition in set(partitions):
            if self._exactly_once:
                found = transaction_producer(self._app, self._source_topic, partition)
                if found is None:
                    raise PartitionRevoked(partition)
                producers[partition] = found
            else:
                producers[partition] = default
        self._producers = producers
        # A slot whose source partition has another producer now (a
        # rebalance took the partition away and gave it back) is dropped.
        stale = [
            at
            for at, slot in self._slots.items()
            if producers.get(at[0], slot.producer) is not slot.producer
        ]
        if stale:
            for at in stale:
                del self._slots[at]
            self._slot_of_key.clear()
        for slot in self._slots.values():
            slot.discard()
        for topic in topics:
            if topic not in self._partition_counts:
                self._partition_counts[topic] = await wait_for_topic(default, topic)

    def add(
        self,
        source_partition: int,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
        *,
        partition: int | None = None,
    ) -> None:
        """Queue one record for ``flush``; ``partition`` defaults to the key's."""
        if partition is None:
            slot = self._slot_of_key.get((source_partition, topic, key))
            if slot is None:
                slot = self._slot_for_key(source_partition, topic, key)
        else:
            slot = self._slot(source_partition, topic, partition)
        count = slot.count
        if slot.append(count, None, key, value, headers) is not None:
            slot.count = count + 1
            return
        if count:
            # Full: send it as it is, start the next one.
            self._pending_full.append((slot.producer, slot.take(), topic, slot.partition))
            if slot.append(0, None, key, value, headers) is not None:
                slot.count = 1
                return
        # Larger than a batch: the producer sends it alone.
        self._oversized.append((source_partition, topic, slot.partition, key, value, headers))

    async def flush(self) -> list[Any]:
        """Send everything added; returns, when the broker has all of it, the
        RecordMetadata of each batch sent (offset: the batch's first)."""
        sent = []
        # A batch left open lingers in the producer (``producer_linger``)
        # for records that will never come, before each partition's next;
        # closed, it goes out at once.
        for producer, builder, topic, partition in self._pending_full:
            sent.append(await producer.send_batch(builder, topic, partition=partition))
        self._pending_full.clear()
        for slot in self._slots.values():
            if slot.count:
                batch = slot.take()
                sent.append(
                    await slot.producer.send_batch(batch, slot.topic, partition=slot.partition)
                )
        for source_partition, topic, partition, key, value, headers in self._oversized:
            producer = self._producers[source_partition]
            sent.append(
                await producer.send(topic, value, key=key, partition=partition, headers=headers)
            )
        self._oversized.clear()
        return list(await asyncio.gather(*sent))

    def _slot_for_key(self, source_partition: int, topic: str, key: bytes | None) -> BatchSlot:
        slot = self._slot(source_partition, topic, self._partition(topic, key))
        if key is not None:
            if len(self._slot_of_key) > 100_000:  # many entities: keep the cache bounded
                self._slot_of_key.clear()
            self._slot_of_key[(source_partition, topic, key)] = slot
        return slot

    def _slot(self, source_partition: int, topic: str, partition: int) -> BatchSlot:
        producer = self._producers.get(source_partition)
        if producer is None:
            raise PartitionRevoked(source_partition)
        slot = self._slots.get((source_partition, topic, partition))
        if slot is None:
            slot = self._slots[(source_partition, topic, partition)] = BatchSlot(
                producer, topic, partition
            )
        return slot

    def _partition(self, topic: str, key: bytes | None) -> int:
        if key is not None:
            found = self._partition_of.get((topic, key))
            if found is not None:
                return found
        chosen = partition_for(
            self._metadata_producer, topic, key, self._partition_counts.get(topic, 0)
        )
        if key is not None:
            if len(self._partition_of) > 100_000:  # many entities: keep the cache bounded
                self._partition_of.clear()
            self._partition_of[(topic, key)] = chosen
        return chosen


class PartitionRevoked(Exception):
    """This worker no longer owns the partition: its records are another's now."""

    def __init__(self, partition: int) -> None:
        super().__init__(f"partition {partition} is not assigned to this worker")
        self.partition = partition
