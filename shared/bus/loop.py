"""The one way to consume Kafka (house rule 12): poll → decode → dead-letter →
handle → flush → commit.

A service writes a handler; ``ConsumeLoop`` does the rest, the same way
everywhere:

1. poll a batch from the source (a ``BusConsumer`` in a group, or a
   ``BusTail`` outside any group);
2. decode each record; one that is not the topic's message is dead-lettered
   (rule 7) and never reaches the handler;
3. hand the decoded records to the handler, in order, as one ``Batch``; a
   record the handler refuses (``Batch.refuse``, or ``RecordRefused`` raised
   by a per-record handler) is dead-lettered with the handler's reason;
4. flush the publisher: the handler's outputs and the dead letters are
   delivered, or ``Unavailable`` propagates and nothing is committed;
5. commit the batch's offsets (group consumers only).

The lag comes with the source: a ``BusConsumer`` or ``BusTail`` exports its
own (``shared.bus.lag``) as it is polled, so a loop, or a reader polling
without one (svc_trainer's worker), needs nothing more.

So delivery is at least once: a process killed anywhere reads the batch
again, and handlers are idempotent. Any other error from the handler
(``Unavailable`` included: a dependency that is down is retried by a
restart, never dead-lettered) propagates with the batch uncommitted.

The publisher is injected (``Publisher``): ``BusProducer`` on a broker,
``shared.bus.testing.MemoryPublisher`` in unit tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, NamedTuple, Protocol

from google.protobuf.message import Message

from shared.bus import envelope
from shared.bus.codec import MessageT
from shared.bus.consumer import Record
from shared.bus.deadletter import from_record, from_undecodable
from shared.contracts.aistack.v1 import events_pb2
from shared.errors import AistackError, UndecodableRecord
from shared.log import get_logger

log = get_logger("shared.bus")


class Publisher(Protocol):
    """What a handler publishes through; ``BusProducer`` is one."""

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
    ) -> str: ...

    def publish_dead_letter(self, topic: str, letter: events_pb2.DeadLetter) -> str: ...

    def flush(self, timeout: float = 30.0) -> None:
        """Deliver everything published; raises Unavailable if it cannot."""

    def poll(self, timeout: float = 0.0) -> int: ...


class Source(Protocol[MessageT]):
    def poll_batch(
        self, max_records: int = 500, timeout: float = 1.0
    ) -> list[Record[MessageT]]: ...


class Committing(Source[MessageT], Protocol[MessageT]):
    """A source in a consumer group: the loop commits what it handled."""

    def commit(
        self, records: list[Record[MessageT]] | None = None, *, asynchronous: bool = False
    ) -> None: ...


class Counter(Protocol):
    """The part of a Prometheus counter the loop uses (labelled or not)."""

    def inc(self, amount: float = 1) -> None: ...


class LabelledCounter(Protocol):
    def labels(self, *values: str) -> Counter: ...


class RecordRefused(AistackError):
    """A handler's verdict that a decoded record cannot be accepted (an unknown
    trial, a refused artifact): the loop dead-letters it with ``reason``.
    Never raise it for a retryable failure: that must propagate."""

    reason = "refused"


class DeadLetters:
    """Dead-lettering for one service (rule 7): the original bytes and headers
    plus ``error`` and ``source`` headers, counted by reason and logged with
    where the record came from (rule 8). Publishes only: the caller flushes
    before it commits."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        topic: str,
        service: str,
        counter: LabelledCounter | None = None,
    ) -> None:
        self._publisher = publisher
        self._topic = topic
        self._service = service
        self._counter = counter

    def undecodable(self, error: UndecodableRecord) -> events_pb2.DeadLetter:
        """Dead-letter a record that is not its topic's message."""
        letter = from_undecodable(error, service=self._service)
        self.send(letter, event_id=_event_id(error.headers))
        return letter

    def refuse(self, record: Record[Any], reason: str, message: str) -> events_pb2.DeadLetter:
        """Dead-letter a record that decoded but cannot be accepted."""
        letter = from_record(record, reason=reason, message=message, service=self._service)
        self.send(letter, event_id=record.envelope.event_id)
        return letter

    def send(self, letter: events_pb2.DeadLetter, *, event_id: str = "") -> None:
        """Publish a letter built earlier (``deadletter.from_record`` …)."""
        if self._counter is not None:
            self._counter.labels(letter.reason).inc()
        self._publisher.publish_dead_letter(self._topic, letter)
        source = letter.source
        log.warning(
            "record.dead_lettered",
            topic=source.topic,
            partition=source.partition,
            offset=source.offset,
            event_id=event_id,
            reason=letter.reason,
            message=letter.message,
        )


class Received(NamedTuple, Generic[MessageT]):
    message: MessageT
    record: Record[MessageT]


class Batch(Generic[MessageT]):
    """The decoded records of one poll, oldest first. Iterating gives
    ``(message, record)`` pairs; ``refuse`` dead-letters one of them."""

    __slots__ = ("_dead_letters", "_items")

    def __init__(self, items: Sequence[Received[MessageT]], dead_letters: DeadLetters) -> None:
        self._items = list(items)
        self._dead_letters = dead_letters

    def __iter__(self) -> Iterator[Received[MessageT]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def refuse(self, record: Record[MessageT], error: AistackError) -> None:
        """Dead-letter ``record`` with ``error.reason``; the batch goes on."""
        self._dead_letters.refuse(record, error.reason, error.message)


BatchHandler = Callable[[Batch[MessageT]], None]
RecordHandler = Callable[[MessageT, Record[MessageT]], None]


def each(handler: RecordHandler[MessageT]) -> BatchHandler[MessageT]:
    """A batch handler calling ``handler(message, record)`` for each record in
    order; a record whose call raises ``RecordRefused`` is dead-lettered."""

    def handle(batch: Batch[MessageT]) -> None:
        for message, record in batch:
            try:
                handler(message, record)
            except RecordRefused as refused:
                batch.refuse(record, refused)

    return handle


class ConsumeLoop(Generic[MessageT]):
    """Runs ``handler`` over what ``source`` yields; see the module docstring
    for the order of steps and what each failure does.

    ``skip_tombstones``: a record without a value is passed over (a compacted
    topic's deletions) instead of dead-lettered as undecodable. ``read``
    counts every record polled, good or bad.
    """

    def __init__(
        self,
        source: Source[MessageT],
        handler: BatchHandler[MessageT],
        *,
        publisher: Publisher,
        dead_letters: DeadLetters,
        max_records: int = 500,
        poll_timeout: float = 0.2,
        skip_tombstones: bool = False,
        read: Counter | None = None,
    ) -> None:
        self._source = source
        self._handler = handler
        self._publisher = publisher
        self._dead_letters = dead_letters
        self._max_records = max_records
        self._poll_timeout = poll_timeout
        self._skip_tombstones = skip_tombstones
        self._read = read
        commit = getattr(source, "commit", None)
        self._commit: Callable[[list[Record[MessageT]]], None] | None = commit

    def run(self, stop: Callable[[], bool]) -> None:
        """Step until ``stop()`` is true (checked before every poll)."""
        while not stop():
            self.step()

    def step(self) -> int:
        """One poll and all it brought, handled, delivered and committed;
        returns how many records it polled."""
        records = self._source.poll_batch(self._max_records, timeout=self._poll_timeout)
        if not records:
            return 0
        self.handle(records)
        return len(records)

    def handle(self, records: list[Record[MessageT]]) -> None:
        """Steps 2 to 5 for records already polled."""
        if self._read is not None:
            self._read.inc(len(records))
        received: list[Received[MessageT]] = []
        for record in records:
            if self._skip_tombstones and record.is_tombstone:
                continue
            try:
                received.append(Received(record.decode(), record))
            except UndecodableRecord as error:
                self._dead_letters.undecodable(error)
        if received:
            self._handler(Batch(received, self._dead_letters))
        self._publisher.flush()
        if self._commit is not None:
            self._commit(records)


def _event_id(headers: list[tuple[str, bytes]]) -> str:
    return envelope.parse_headers(headers).event_id


__all__ = [
    "Batch",
    "BatchHandler",
    "Committing",
    "ConsumeLoop",
    "DeadLetters",
    "LabelledCounter",
    "Publisher",
    "Received",
    "RecordHandler",
    "RecordRefused",
    "Source",
    "each",
]
