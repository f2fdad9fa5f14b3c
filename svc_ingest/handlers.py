"""One raw record in, one outcome out: clean events, a dead letter, or a duplicate.

Thin: the cleaning is ``Cleaner``'s (the common JSON sensor reading's, where
it is built, ``sensor_bytes``'), the memory of ids ``DedupWindow``'s; this
module only picks the outcome and builds the record to publish.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from shared.bus import envelope
from shared.bus.codec import type_name
from shared.bus.deadletter import dead_letter, dead_letter_headers
from shared.bus.envelope import content_type_and_trace, traceparent_header
from shared.contracts.aistack.v1 import events_pb2
from svc_ingest.cleaner import Cleaner
from svc_ingest.dedup import DedupWindow
from svc_ingest.payload import reads_as_json_object
from svc_ingest.rejection import RecordRejected
from svc_ingest.sensor_bytes import compiled, fresh_traceparent, with_content_hash

SERVICE = "svc_ingest"
#: Before a dead letter's id in the dedup window: event ids are printable
#: (``fields.identifier``) or content hashes, so none starts with a NUL byte
#: and a source position never stands for an event's id.
DEAD_LETTER_ID_PREFIX = b"\x00dead-letter:"

OutcomeKind = Literal["clean", "dead_letter", "duplicate"]
# key, value, headers of one more record to ``Outcome.topic``
Extra = tuple[bytes | None, bytes, list[tuple[str, bytes]]]


@dataclass(slots=True)
class Outcome:
    kind: OutcomeKind
    # What to publish; topic is "" for a duplicate, which publishes nothing.
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    reason: str = ""
    message: str = ""
    event_id: str = ""
    # A record of several readings (a SenML pack, a Telegraf batch, lines of
    # line protocol): the clean events after the first, to the same topic.
    more: Sequence[Extra] = ()


class RawRecordLike(Protocol):
    """What ``handle_batch`` reads of a raw record: a Kafka client's
    ``ConsumerRecord``, Faust's ``Message`` or a ``RawRecord``."""

    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]] | Mapping[str, bytes] | None: ...


class RawRecord(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] | Mapping[str, bytes] | None


#: ``publish(source partition, topic, key, value, headers)``: one record out.
Publish = Callable[[int, str, bytes | None, bytes | None, list[tuple[str, bytes]]], object]


def _publish_nothing(
    source_partition: int,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes]],
) -> None:
    return None


class RecordHandler:
    """Decides the outcome of each raw record read from ``source_topic``."""

    def __init__(
        self,
        cleaner: Cleaner,
        dedup: DedupWindow,
        *,
        source_topic: str,
        clean_topic: str,
        dlq_topic: str,
    ) -> None:
        self._cleaner = cleaner
        self._dedup = dedup
        self._source_topic = source_topic
        self._clean_topic = clean_topic
        self._dlq_topic = dlq_topic
        self._clean_headers = envelope.HeaderTemplate(type_name(events_pb2.CleanEvent), SERVICE)
        self._dlq_headers = envelope.HeaderTemplate(type_name(events_pb2.DeadLetter), SERVICE)
        self._compiled = compiled(cleaner, source_topic)
        # Whether a content type reads as a JSON object, per content type seen.
        self._json: dict[str, bool] = {}

    def handle(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | Mapping[str, bytes] | None,
        now_us: int,
    ) -> Outcome:
        """The outcome of one record (``handle_batch`` of it alone)."""
        record = RawRecord(partition, offset, key, value, headers)
        return self.handle_batch((record,), now_us, _publish_nothing)[0]

    def handle_batch(
        self, records: Sequence[RawRecordLike], now_us: int, publish: Publish
    ) -> list[Outcome]:
        """The outcome of each record, in order; each record to publish goes
        to ``publish(source partition, topic, key, value, headers)`` as it is
        decided.

        One loop over the batch, the common sensor reading's path written
        out in it, where a call a step cost about a quarter of a record's
        time in process (docs/benchmarks.md, the cleaner)."""
        outcomes: list[Outcome] = []
        keep = outcomes.append
        compiled = None if self._compiled is None else self._compiled.unhashed
        json_types = self._json
        first_sighting = self._dedup.first_sighting
        clean_topic = self._clean_topic
        clean_headers = self._clean_headers.build_encoded
        fresh_trace = fresh_traceparent
        now_ms = now_us // 1000
        for record in records:
            partition = record.partition
            offset = record.offset
            value = record.value
            headers = record.headers
            # Kafka clients hand over a list of pairs; the ABC check is for the rest.
            if type(headers) is list:
                pairs = headers
            else:
                pairs = list(headers.items() if isinstance(headers, Mapping) else headers or ())
            content_type, parent = content_type_and_trace(pairs)
            if compiled is not None and value:
                is_json = json_types.get(content_type)
                if is_json is None:
                    is_json = self._reads_as_json(content_type)
                found = compiled(value, now_us, partition, offset) if is_json else None
                if found is not None:
                    event_id, key_out, event = (
                        found if found[0] else with_content_hash(value, found)
                    )
                    id_bytes = event_id.encode()
                    if not first_sighting(id_bytes, now_ms, partition, offset):
                        keep(Outcome("duplicate", "", None, None, [], "", "", event_id))
                        continue
                    trace = traceparent_header(parent) if parent else fresh_trace()
                    headers_out = clean_headers(id_bytes, trace)
                    publish(partition, clean_topic, key_out, event, headers_out)
                    keep(
                        Outcome("clean", clean_topic, key_out, event, headers_out, "", "", event_id)
                    )
                    continue
            outcome = self._python_outcome(
                partition, offset, record.key, value, pairs, content_type, parent, now_us
            )
            if outcome.topic:
                publish(partition, outcome.topic, outcome.key, outcome.value, outcome.headers)
                for extra in outcome.more:
                    publish(partition, outcome.topic, *extra)
            keep(outcome)
        return outcomes

    def _python_outcome(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        pairs: list[tuple[str, bytes]],
        content_type: str,
        parent: str,
        now_us: int,
    ) -> Outcome:
        """The outcome of a record the compiled path declined (or of any,
        where it is not built)."""
        now_ms = now_us // 1000
        try:
            events = self._cleaner.clean_all(value, key, content_type, now_us)
        except RecordRejected as rejected:
            # A record read again (the offsets a rebalance hands back can
            # trail outputs already committed) is dead-lettered once, as a
            # clean event is published once: by its source position.
            letter_id = f"{self._source_topic}/{partition}/{offset}"
            seen = DEAD_LETTER_ID_PREFIX + letter_id.encode()
            if not self._dedup.first_sighting(seen, now_ms, partition, offset):
                return Outcome("duplicate", "", None, None, [], event_id=letter_id)
            trace = traceparent_header(parent)
            return self._dead_letter(
                partition, offset, key, value, pairs, rejected, trace, letter_id
            )
        if len(events) == 1:  # most records: no lists to build
            (event,) = events
            event_id = event.event_id
            id_bytes = event_id.encode()
            if not self._dedup.first_sighting(id_bytes, now_ms, partition, offset):
                return Outcome("duplicate", "", None, None, [], event_id=event_id)
            key_out, value_out, headers_out = self._clean_record(
                event, id_bytes, partition, offset, now_us, traceparent_header(parent)
            )
            return Outcome(
                "clean", self._clean_topic, key_out, value_out, headers_out, event_id=event_id
            )
        first_sighting = self._dedup.first_sighting
        fresh = [
            (event, id_bytes)
            for event in events
            if first_sighting(id_bytes := event.event_id.encode(), now_ms, partition, offset)
        ]
        if not fresh:
            return Outcome("duplicate", "", None, None, [], event_id=events[0].event_id)
        trace = traceparent_header(parent)
        records = [
            self._clean_record(event, id_bytes, partition, offset, now_us, trace)
            for event, id_bytes in fresh
        ]
        key_out, value_out, headers_out = records[0]
        return Outcome(
            "clean",
            self._clean_topic,
            key_out,
            value_out,
            headers_out,
            event_id=fresh[0][0].event_id,
            more=records[1:],
        )

    def _clean_record(
        self,
        event: events_pb2.CleanEvent,
        id_bytes: bytes,
        partition: int,
        offset: int,
        now_us: int,
        trace: bytes,
    ) -> Extra:
        ingest_time = event.ingest_time
        ingest_time.seconds, rest = divmod(now_us, 1_000_000)
        ingest_time.nanos = rest * 1000
        source = event.source
        source.topic = self._source_topic
        source.partition = partition
        source.offset = offset
        return (
            event.entity_id.encode(),
            event.SerializeToString(),
            self._clean_headers.build_encoded(id_bytes, trace),
        )

    def _reads_as_json(self, content_type: str) -> bool:
        found = self._json.get(content_type)
        if found is None:
            if len(self._json) >= 64:  # producers repeat a handful
                self._json.clear()
            found = self._json[content_type] = reads_as_json_object(content_type)
        return found

    def _dead_letter(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
        rejected: RecordRejected,
        trace: bytes,
        letter_id: str,
    ) -> Outcome:
        letter = dead_letter(
            reason=rejected.reason,
            message=rejected.message,
            service=SERVICE,
            topic=self._source_topic,
            partition=partition,
            offset=offset,
            value=value,
            key=key,
            headers=headers,
        )
        # The dead letter's own id is its source position: a replay of the same
        # record after a crash yields the same id, so consumers can drop repeats.
        out_headers = self._dlq_headers.build_encoded(letter_id.encode(), trace)
        out_headers.extend(dead_letter_headers(letter))
        return Outcome(
            "dead_letter",
            self._dlq_topic,
            key,
            letter.SerializeToString(),
            out_headers,
            reason=rejected.reason,
            message=rejected.message,
            event_id=letter_id,
        )
