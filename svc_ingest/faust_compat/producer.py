"""The producers behind Faust's ``app.producer``, reached through its privates.

Under exactly_once Faust's TransactionManager keeps one transactional
aiokafka producer per source partition, id ``{app}-{group}-{partition}``;
svc_ingest sends each record through the one of its raw record's partition
(``svc_ingest.output`` says why).
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaProducer
from faust.types import AppT

__all__ = ["default_producer", "partition_for", "transaction_producer", "wait_for_topic"]


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


async def wait_for_topic(producer: AIOKafkaProducer, topic: str) -> None:
    """Until the producer's client holds ``topic``'s metadata (its partitions)."""
    await producer.client._wait_on_metadata(topic)


def partition_for(producer: AIOKafkaProducer, topic: str, key: bytes | None) -> int:
    """The partition ``producer.send`` would choose for ``key`` (the default partitioner)."""
    cluster = producer.client.cluster
    every = list(cluster.partitions_for_topic(topic) or ())
    available = list(cluster.available_partitions_for_topic(topic) or ())
    return int(producer._partitioner(key, every, available))
