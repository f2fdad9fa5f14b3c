"""The bus in memory, for unit tests of handlers (FastStream's test broker is
the idea): no broker, the same ``ConsumeLoop``, the same records.

- ``MemoryPublisher``: a ``Publisher`` keeping what it was given, with the
  headers a ``BusProducer`` would send.
- ``record(...)``: a ``Record`` built from a message or from raw bytes, at
  a chosen topic, partition and offset.
- ``MemorySource``: a ``Committing`` source handing out given records, in
  batches, and keeping what was committed; a tail (``caught_up``,
  ``close``) as well.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, cast

from google.protobuf.message import Message

from shared.bus import envelope
from shared.bus.codec import MessageT, type_name
from shared.bus.consumer import Record
from shared.bus.deadletter import dead_letter_headers
from shared.contracts.aistack.v1 import events_pb2
from shared.errors import Unavailable


@dataclass(frozen=True)
class Published:
    topic: str
    message: Message
    key: bytes | None
    headers: list[tuple[str, bytes]]
    partition: int | None


@dataclass
class MemoryPublisher:
    """Keeps every message published; ``flush`` moves the queued ones to
    ``delivered``, or raises Unavailable while ``down`` is set (a broker
    that is gone: nothing queued is delivered)."""

    source: str = "test"
    queued: list[Published] = field(default_factory=list)
    delivered: list[Published] = field(default_factory=list)
    down: bool = False
    flushes: int = 0

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
        template = envelope.HeaderTemplate(type_name(type(message)), self.source)
        event_id = event_id or envelope.new_event_id()
        headers = template.build(event_id, traceparent or envelope.new_traceparent())
        headers.extend(extra_headers or ())
        encoded = key.encode() if isinstance(key, str) else key
        self.queued.append(Published(topic, message, encoded, headers, partition))
        return event_id

    def publish_dead_letter(self, topic: str, letter: events_pb2.DeadLetter) -> str:
        return self.publish(
            topic,
            letter,
            key=letter.original_key or None,
            extra_headers=dead_letter_headers(letter),
        )

    def flush(self, timeout: float = 30.0) -> None:
        self.flushes += 1
        if self.down:
            raise Unavailable("the memory broker is down")
        self.delivered.extend(self.queued)
        self.queued.clear()

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def messages(self, topic: str) -> list[Message]:
        """What was delivered to ``topic``, in order."""
        return [p.message for p in self.delivered if p.topic == topic]

    def dead_letters(self, topic: str) -> list[events_pb2.DeadLetter]:
        return [cast(events_pb2.DeadLetter, m) for m in self.messages(topic)]


class _Raw:
    """Stands in for confluent-kafka's Message: the accessors Record reads."""

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._headers = key, value, headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers


def record(
    message_cls: type[MessageT],
    value: Message | bytes | None,
    *,
    topic: str = "test",
    partition: int = 0,
    offset: int = 0,
    key: str | bytes | None = None,
    headers: list[tuple[str, bytes]] | None = None,
    event_id: str = "",
) -> Record[MessageT]:
    """A record as a consumer would hand it over. A message gets the envelope
    headers a ``BusProducer`` sends (unless ``headers`` are given); bytes and
    ``None`` (a tombstone) travel as they are, with ``headers`` or none."""
    if isinstance(value, Message):
        if headers is None:
            template = envelope.HeaderTemplate(type_name(type(value)), "test")
            headers = template.build(
                event_id or envelope.new_event_id(), envelope.new_traceparent()
            )
        value = value.SerializeToString()
    encoded = key.encode() if isinstance(key, str) else key
    raw = _Raw(topic, partition, offset, encoded, value, headers)
    return Record(cast(Any, raw), message_cls)


class MemorySource(Generic[MessageT]):
    """Hands out ``records`` in polls of at most ``max_records``; keeps the
    records committed, in commit order."""

    def __init__(self, records: Iterable[Record[MessageT]] = ()) -> None:
        self.pending: list[Record[MessageT]] = list(records)
        self.committed: list[Record[MessageT]] = []
        self.closed = False

    def poll_batch(self, max_records: int = 500, timeout: float = 1.0) -> list[Record[MessageT]]:
        batch, self.pending = self.pending[:max_records], self.pending[max_records:]
        return batch

    def commit(
        self, records: list[Record[MessageT]] | None = None, *, asynchronous: bool = False
    ) -> None:
        self.committed.extend(records or ())

    def caught_up(self) -> bool:
        return not self.pending

    def close(self) -> None:
        self.closed = True


__all__ = ["MemoryPublisher", "MemorySource", "Published", "record"]
