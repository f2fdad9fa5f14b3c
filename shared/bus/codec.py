"""Protobuf values in and out of Kafka records, with typed decode errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from shared.bus import envelope
from shared.errors import UndecodableRecord

MessageT = TypeVar("MessageT", bound=Message)

_PROTOBUF = envelope.PROTOBUF_CONTENT_TYPE.encode()
_TYPE_NAMES: dict[type[Message], bytes] = {}


def type_name(message_cls: type[Message]) -> str:
    """The full protobuf name, e.g. ``aistack.v1.CleanEvent``."""
    return str(message_cls.DESCRIPTOR.full_name)


class Rejected(Exception):
    """Why bytes are not the expected message; positioned by the caller."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse(
    message_cls: type[MessageT],
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]] | None,
) -> MessageT:
    """Parse ``value`` as ``message_cls``, checking the envelope's declared type.

    Raises Rejected; ``decode`` and ``Record.decode`` turn that into an
    UndecodableRecord carrying the record's position. Unknown fields are
    accepted: a newer producer may add fields (schema evolution).
    """
    if value is None:
        raise Rejected("record has no value (a tombstone)", "no_value")
    expected = _TYPE_NAMES.get(message_cls)
    if expected is None:
        expected = _TYPE_NAMES[message_cls] = type_name(message_cls).encode()
    for key, declared in headers or ():
        if key == envelope.TYPE:
            if declared != expected:
                raise Rejected(
                    f"record holds {_text(declared)!r}, expected {expected.decode()!r}",
                    "wrong_message_type",
                )
        elif key == envelope.CONTENT_TYPE and declared != _PROTOBUF:
            raise Rejected(
                f"content-type is {_text(declared)!r}, expected {envelope.PROTOBUF_CONTENT_TYPE!r}",
                "wrong_content_type",
            )
    try:
        return message_cls.FromString(value)
    except DecodeError as exc:
        raise Rejected(
            f"value is not a valid {expected.decode()}: {exc}", "invalid_protobuf"
        ) from exc


def decode(
    message_cls: type[MessageT],
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]] | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None = None,
) -> MessageT:
    """Parse a record's value as ``message_cls``.

    Raises UndecodableRecord (carrying topic, partition, offset, the original
    bytes and headers) when the value is missing, is not protobuf, or its
    headers name another message type or content type.
    """
    try:
        return parse(message_cls, value, headers)
    except Rejected as rejected:
        raise UndecodableRecord(
            str(rejected),
            reason=rejected.reason,
            topic=topic,
            partition=partition,
            offset=offset,
            value=value,
            key=key,
            headers=list(headers or ()),
        ) from rejected.__cause__


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", errors="replace")
