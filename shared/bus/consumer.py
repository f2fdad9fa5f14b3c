"""Consuming protobuf messages with their envelope (confluent-kafka).

At-least-once: offsets are committed only when the caller says the records
are done (``commit``), never automatically.

Every reader here exports its lag (``shared.bus.lag``): a group member under
its group id, a ``BusTail`` under the ``reader`` name it is given.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Generic, cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka import Message as KafkaMessage

from shared.bus import envelope
from shared.bus.codec import MessageT, Rejected, decode, parse
from shared.bus.lag import ConsumerLag
from shared.bus.topics import cluster_metadata
from shared.errors import Unavailable, UndecodableRecord
from shared.log import get_logger
from shared.settings import KafkaSettings

log = get_logger("shared.bus")

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
        return self._msg.headers()

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
        on_revoke: Callable[[list[tuple[str, int]]], None] | None = None,
    ) -> None:
        """``on_revoke`` is told which (topic, partition)s this member lost in
        a rebalance, before they move to another member. Its lag is exported
        under ``group_id``."""
        self._lag = ConsumerLag(group_id)
        self._consumer = Consumer(
            {
                **kafka.client_config(),
                **CONSUMER_DEFAULTS,
                "group.id": group_id,
                **self._lag.client_config(),
                **(config or {}),
            }
        )
        self._cls = message_cls
        if on_revoke is None:
            self._consumer.subscribe(list(topics))
        else:
            revoked = on_revoke

            def _on_revoke(_: Consumer, partitions: list[TopicPartition]) -> None:
                revoked([(p.topic, p.partition) for p in partitions])

            self._consumer.subscribe(list(topics), on_revoke=_on_revoke, on_lost=_on_revoke)

    def poll_batch(self, max_records: int = 500, timeout: float = 1.0) -> list[Record[MessageT]]:
        """Up to ``max_records`` records, waiting at most ``timeout`` seconds.

        Transient broker errors are left to librdkafka's retries; fatal ones
        raise Unavailable.
        """
        raw = _take(self._consumer, max_records, timeout)
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
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError._NO_OFFSET:
                return
            raise Unavailable(f"offset commit failed: {exc}") from exc

    def pause(self, records: Iterable[Record[MessageT]] = ()) -> None:
        """Stop fetching from every assigned partition, while staying in the
        group (keep calling ``poll_batch``: it returns nothing from paused
        partitions). ``records`` already consumed are rewound, so that they
        are read again after ``resume``."""
        for record in records:
            self._consumer.seek(TopicPartition(record.topic, record.partition, record.offset))
        assigned = self._consumer.assignment()
        if assigned:
            self._consumer.pause(assigned)

    def resume(self) -> None:
        assigned = self._consumer.assignment()
        if assigned:
            self._consumer.resume(assigned)

    def close(self) -> None:
        """Leave the group cleanly (partitions are reassigned at once)."""
        try:
            self._consumer.close()
        finally:
            self._lag.close()

    def __enter__(self) -> BusConsumer[MessageT]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class BusTail(Generic[MessageT]):
    """Reads every partition of ``topics`` outside any consumer group, from
    where each ends now (every reader sees every record published after it
    started, e.g. control messages that all replicas must see) or, with
    ``from_beginning``, from the first record still in the log (a compacted
    registry replayed on start), or, with ``last``, from that many records
    before each partition's end (a recent past to rebuild state from), or,
    with ``since_ms``, from the first record whose timestamp is at or after
    it (a past of a given length);
    ``caught_up`` says when the records that were there at start have all
    been read. Nothing is committed. Raises Unavailable when Kafka does not
    answer within ``timeout`` seconds (a broker restarting is waited for) or
    a topic is not there."""

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        topics: Iterable[str],
        message_cls: type[MessageT],
        timeout: float = 30.0,
        from_beginning: bool = False,
        last: int = 0,
        since_ms: int | None = None,
        reader: str = "tail",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self._lag = ConsumerLag(reader)
        self._consumer = Consumer(
            {
                **kafka.client_config(),
                **CONSUMER_DEFAULTS,
                # librdkafka wants a group id even for assigned partitions; it
                # is never joined nor committed to.
                "group.id": f"aistack-tail-{uuid.uuid4().hex}",
                **self._lag.client_config(),
                **(config or {}),
            }
        )
        self._cls = message_cls
        metadata = cluster_metadata(self._consumer, timeout, bootstrap=kafka.bootstrap)
        assignment = []
        # Per partition: (first offset, end offset) as of now, and where the
        # tail starts reading it.
        self._marks: dict[tuple[str, int], tuple[int, int]] = {}
        self._starts: dict[tuple[str, int], int] = {}
        for topic in topics:
            described = metadata.topics.get(topic)
            if described is None or described.error is not None:
                raise Unavailable(f"topic {topic} is not available to tail")
            for partition in described.partitions:
                # The end as of now, not as of the first fetch: nothing
                # published after this constructor returns is missed.
                low, end = self._watermarks(TopicPartition(topic, partition), timeout)
                self._marks[(topic, partition)] = (low, end)
                start = OFFSET_BEGINNING if from_beginning else max(low, end - last)
                if since_ms is not None:
                    start = self._offset_at(
                        TopicPartition(topic, partition, since_ms), end, timeout
                    )
                self._starts[(topic, partition)] = low if start == OFFSET_BEGINNING else start
                assignment.append(TopicPartition(topic, partition, start))
        self._consumer.assign(assignment)
        self._assignment = assignment

    def _watermarks(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        # A topic created a moment ago may not have its leaders elected yet.
        deadline = time.monotonic() + timeout
        while True:
            try:
                low, end = self._consumer.get_watermark_offsets(partition, timeout=timeout)
                return int(low), int(end)
            except KafkaException as exc:
                # Not leader / leader not available are not flagged retriable,
                # yet pass in a moment: retry everything until the deadline.
                if time.monotonic() > deadline:
                    raise Unavailable(f"no end offset for {partition.topic}: {exc}") from exc
                time.sleep(0.2)

    def _offset_at(self, at: TopicPartition, end: int, timeout: float) -> int:
        try:
            (found,) = self._consumer.offsets_for_times([at], timeout=timeout)
        except KafkaException as exc:
            raise Unavailable(f"no offset by time for {at.topic}: {exc}") from exc
        # -1: no record that late, so the tail starts at the end.
        return end if found.offset < 0 else int(found.offset)

    def caught_up(self) -> bool:
        """Whether every record each partition held at start has been read."""
        for position in self._consumer.position(self._assignment):
            key = (position.topic, position.partition)
            low, end = self._marks[key]
            # Nothing read from a partition yet: no position, the start is it
            # (one that starts at its end has nothing to read).
            offset = position.offset if position.offset >= 0 else self._starts[key]
            if end > low and offset < end:
                return False
        return True

    def poll_batch(self, max_records: int = 500, timeout: float = 1.0) -> list[Record[MessageT]]:
        raw = _take(self._consumer, max_records, timeout)
        return [Record(msg, self._cls) for msg in raw if msg.error() is None]

    def close(self) -> None:
        try:
            self._consumer.close()
        finally:
            self._lag.close()


def _take(consumer: Consumer, max_records: int, timeout: float) -> list[KafkaMessage]:
    """Up to ``max_records`` messages: the first waited for at most
    ``timeout``, then what is already buffered. librdkafka's batch consume
    waits out its whole timeout unless the batch fills, which put up to
    ``timeout`` seconds on every hop a lone record makes (a trial request,
    its report); a single poll returns as soon as one arrives."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    if max_records <= 1:
        return [first]
    return [first, *consumer.consume(max_records - 1, 0)]


def read_to_end(
    kafka: KafkaSettings,
    topic: str,
    message_cls: type[MessageT],
    timeout: float,
    *,
    reader: str = "replay",
) -> list[Record[MessageT]]:
    """Every record ``topic`` holds now, from its first, in each partition's
    order (a compacted registry, a log to search). Raises Unavailable when
    they are not all read within ``timeout`` seconds. The lag is exported
    under ``reader`` while it reads."""
    tail: BusTail[MessageT] = BusTail(
        kafka, topics=[topic], message_cls=message_cls, from_beginning=True, reader=reader
    )
    records: list[Record[MessageT]] = []
    deadline = time.monotonic() + timeout
    try:
        while not tail.caught_up():
            if time.monotonic() > deadline:
                raise Unavailable(f"the topic {topic} was not read within {timeout} s")
            records.extend(tail.poll_batch())
    finally:
        tail.close()
    return records


def messages_to_end(
    kafka: KafkaSettings,
    topic: str,
    message_cls: type[MessageT],
    timeout: float,
    *,
    reader: str = "replay",
) -> list[MessageT]:
    """The messages ``topic`` holds now (``read_to_end``), decoded, in each
    partition's order. A tombstone is passed over; a record that does not
    decode is skipped with a warning (not the reader's to dead-letter: its
    producer dead-letters its own, and a service reading its own output back
    has nobody to send it to)."""
    messages = []
    for record in read_to_end(kafka, topic, message_cls, timeout, reader=reader):
        if record.is_tombstone:
            continue
        try:
            messages.append(record.decode())
        except UndecodableRecord as error:
            log.warning(
                "record.unreadable",
                topic=error.topic,
                partition=error.partition,
                offset=error.offset,
                reader=reader,
                error=str(error),
            )
    return messages


__all__ = ["BusConsumer", "BusTail", "Record", "messages_to_end", "read_to_end"]
