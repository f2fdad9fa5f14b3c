"""Publishing protobuf messages with the envelope headers (confluent-kafka)."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, cast

from confluent_kafka import KafkaError, Producer
from confluent_kafka import Message as KafkaMessage
from google.protobuf.message import Message

from shared.bus import envelope
from shared.bus.codec import type_name
from shared.bus.deadletter import dead_letter_headers
from shared.contracts.aistack.v1 import events_pb2
from shared.errors import Unavailable
from shared.settings import KafkaSettings

# Durable by default: idempotent producer, all in-sync replicas. Throughput
# comes from batching (linger) and compression, not from weaker acks.
PRODUCER_DEFAULTS: Mapping[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "compression.type": "lz4",
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 200_000,
    # Delivery reports only for failures: a Python callback per delivered
    # record would cost more than the rest of publish.
    "delivery.report.only.error": True,
}


class BusProducer:
    """One Kafka producer for a service.

    ``publish`` is asynchronous: delivery is confirmed by ``flush``, which
    raises Unavailable if any record could not be delivered. Call ``poll(0)``
    now and then in long loops so delivery reports are served.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        source: str,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        failures: list[str] = []

        def on_delivery(error: KafkaError | None, record: KafkaMessage) -> None:
            if error is not None:
                failures.append(f"{record.topic()}: {error.str()}")

        # The delivery callback is set once for the producer, not per record,
        # and holds no reference to self (no cycle keeping queues alive).
        self._producer = Producer(
            {
                **kafka.client_config(),
                **PRODUCER_DEFAULTS,
                "on_delivery": on_delivery,
                **(config or {}),
            }
        )
        self._source = source
        self._templates: dict[type[Message], envelope.HeaderTemplate] = {}
        self._failures = failures

    def publish(
        self,
        topic: str,
        message: Message,
        *,
        key: str | bytes | None,
        event_id: str | None = None,
        traceparent: str | None = None,
        extra_headers: list[tuple[str, bytes]] | None = None,
        partition: int | None = None,
    ) -> str:
        """Queue ``message`` for ``topic``; returns its event id. ``partition``
        overrides the key's partition (the key still travels with the record)."""
        cls = type(message)
        template = self._templates.get(cls)
        if template is None:
            template = self._templates[cls] = envelope.HeaderTemplate(type_name(cls), self._source)
        if event_id is None and traceparent is None:
            event_id, headers = template.build_fresh()
        else:
            event_id = event_id or envelope.new_event_id()
            headers = template.build(event_id, traceparent or envelope.new_traceparent())
        if extra_headers:
            headers.extend(extra_headers)
        self._produce(topic, message.SerializeToString(), key, headers, partition)
        return event_id

    def publish_dead_letter(self, topic: str, letter: events_pb2.DeadLetter) -> str:
        """Queue a dead letter (rule 7): keyed like the original record, with
        the ``error`` and ``source`` headers beside the envelope's."""
        return self.publish(
            topic,
            letter,
            key=letter.original_key or None,
            extra_headers=dead_letter_headers(letter),
        )

    def publish_raw(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: str | bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Queue bytes as they are: dead letters, tombstones (``value=None``)."""
        self._produce(topic, value, key, headers or [])

    def _produce(
        self,
        topic: str,
        value: bytes | None,
        key: str | bytes | None,
        headers: list[tuple[str, bytes]],
        partition: int | None = None,
    ) -> None:
        # confluent-kafka takes -1 (its default) for "by the key".
        chosen = -1 if partition is None else partition
        while True:
            try:
                self._producer.produce(
                    topic, value, key, partition=chosen, headers=cast(Any, headers)
                )
                return
            except BufferError:
                # The local queue is full: serve delivery reports to make room.
                self._producer.poll(0.05)

    def poll(self, timeout: float = 0.0) -> int:
        return int(self._producer.poll(timeout))

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued record is delivered.

        Raises Unavailable naming the failures if any record was not.
        """
        remaining = self._producer.flush(timeout)
        failures = self._failures.copy()
        self._failures.clear()
        if remaining:
            failures.append(f"{remaining} records still queued after {timeout}s")
        if failures:
            raise Unavailable(f"{len(failures)} records not delivered: {'; '.join(failures[:5])}")

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)

    def __enter__(self) -> BusProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
