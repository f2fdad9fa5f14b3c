"""Consuming protobuf messages with their envelope (confluent-kafka).

At-least-once: offsets are committed only when the caller says the records
are done (``commit``), never automatically.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Generic, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as KafkaMessage

from shared.bus import envelope
from shared.bus.codec import MessageT, Rejected, decode, parse
from shared.errors import Unavailable
from shared.settings import KafkaSettings

CONSUMER_DEFAULTS: Mapping[str, Any] = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    # Rebalances hand partitions over incrementally instead of stopping the group.
    "partition.assignment.strategy": "cooperative-sticky",
}


class Record(Generic[MessageT]):
    """One consumed record. ``decode()`` parses it (lazily, so a bad record
    raises only for the caller that asks, who can dead-letter it)."""

    __slots__ = ("_cls", "_msg")

    def __init__(self, raw: KafkaMessage, message_cls: type[MessageT]) -> None:
        self._msg = raw
        self._cls = message_cls

    @property
    def topic(self) -> str:
        return str(self._msg.topic())

    @property
    def partition(self) -> int:
        return cast(int, self._msg.partition())

    @property
    def offset(self) -> int:
        return cast(int, self._msg.offset())

    @property
    def key(self) -> bytes | None:
        key = self._msg.key()
        return None if key is None else bytes(key)

    @property
    def value(self) -> bytes | None:
        value = self._msg.value()
        return None if value is None else bytes(value)

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        return list(self._raw_headers() or ())

    def _raw_headers(self) -> list[tuple[str, bytes]] | None:
        # confluent-kafka always returns a list of (str, bytes) for headers.
        return cast("list[tuple[str, bytes]] | None", self._msg.headers())

    @property
    def envelope(self) -> envelope.Envelope:
        return envelope.parse_headers(self._raw_headers())

    @property
    def is_tombstone(self) -> bool:
        return self._msg.value() is None

    def decode(self) -> MessageT:
        """The record's message; raises UndecodableRecord if it is not one."""
        msg = self._msg
        try:
            return parse(self._cls, msg.value(), self._raw_headers())
        except Rejected:
            # Only a bad record pays for gathering its position.
            return decode(
                self._cls,
                msg.value(),
                self._raw_headers(),
                topic=self.topic,
                partition=self.partition,
                offset=self.offset,
                key=self.key,
            )


class BusConsumer(Generic[MessageT]):
    """A consumer-group member reading one message type from its topics."""

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        group_id: str,
        topics: Iterable[str],
        message_cls: type[MessageT],
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self._consumer = Consumer(
            {**kafka.client_config(), **CONSUMER_DEFAULTS, "group.id": group_id, **(config or {})}
        )
        self._cls = message_cls
        self._consumer.subscribe(list(topics))

    def poll_batch(self, max_records: int = 500, timeout: float = 1.0) -> list[Record[MessageT]]:
        """Up to ``max_records`` records, waiting at most ``timeout`` seconds.

        Transient broker errors are left to librdkafka's retries; fatal ones
        raise Unavailable.
        """
        raw = self._consumer.consume(max_records, timeout)
        cls = self._cls
        records = [Record(msg, cls) for msg in raw if msg.error() is None]
        if len(records) != len(raw):
            for msg in raw:
                error = msg.error()
                if error is not None and error.fatal():
                    raise Unavailable(f"Kafka consumer failed: {error.str()}")
        return records

    def commit(
        self, records: list[Record[MessageT]] | None = None, *, asynchronous: bool = False
    ) -> None:
        """Commit the positions after ``records`` (or after everything consumed)."""
        try:
            if records is None:
                if asynchronous:
                    self._consumer.commit(asynchronous=True)
                else:
                    self._consumer.commit(asynchronous=False)
                return
            latest: dict[tuple[str, int], int] = {}
            for record in records:
                key = (record.topic, record.partition)
                latest[key] = max(latest.get(key, -1), record.offset)
            offsets = [TopicPartition(t, p, o + 1) for (t, p), o in latest.items()]
            if offsets and asynchronous:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            elif offsets:
                self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError._NO_OFFSET:
                return
            raise Unavailable(f"offset commit failed: {exc}") from exc

    def close(self) -> None:
        """Leave the group cleanly (partitions are reassigned at once)."""
        self._consumer.close()

    def __enter__(self) -> BusConsumer[MessageT]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["BusConsumer", "Record"]
