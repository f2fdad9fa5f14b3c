"""Turning a record that cannot be accepted into a DeadLetter (rule 7)."""

from __future__ import annotations

from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from shared.contracts.aistack.v1 import common_pb2, events_pb2
from shared.errors import UndecodableRecord

ERROR_HEADER = "error"
SOURCE_HEADER = "source"


def dead_letter(
    *,
    reason: str,
    message: str,
    service: str,
    topic: str,
    partition: int,
    offset: int,
    value: bytes | None,
    key: bytes | None,
    headers: list[tuple[str, bytes]],
) -> events_pb2.DeadLetter:
    """A DeadLetter keeping the original bytes and headers, and where they were."""
    rejected = Timestamp()
    rejected.GetCurrentTime()
    return events_pb2.DeadLetter(
        reason=reason,
        message=message,
        original_value=value or b"",
        original_key=key or b"",
        original_headers=[common_pb2.Header(key=k, value=v or b"") for k, v in headers],
        source=common_pb2.SourcePosition(topic=topic, partition=partition, offset=offset),
        service=service,
        rejected_time=rejected,
    )


def from_record(record: Any, *, reason: str, message: str, service: str) -> events_pb2.DeadLetter:
    """A DeadLetter for a consumed record (``shared.bus.consumer.Record``) that
    decoded but cannot be accepted."""
    return dead_letter(
        reason=reason,
        message=message,
        service=service,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        value=record.value,
        key=record.key,
        headers=record.headers,
    )


def from_undecodable(error: UndecodableRecord, *, service: str) -> events_pb2.DeadLetter:
    return dead_letter(
        reason=error.reason,
        message=error.detail,
        service=service,
        topic=error.topic,
        partition=error.partition,
        offset=error.offset,
        value=error.value,
        key=error.key,
        headers=error.headers,
    )


def dead_letter_headers(letter: events_pb2.DeadLetter) -> list[tuple[str, bytes]]:
    """The extra ``error`` and ``source`` headers a dead-letter record carries."""
    src = letter.source
    return [
        (ERROR_HEADER, letter.reason.encode()),
        (SOURCE_HEADER, f"{src.topic}/{src.partition}/{src.offset}".encode()),
    ]
