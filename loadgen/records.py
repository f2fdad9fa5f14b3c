"""What the load generator emits: raw records and the good events they encode."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from shared.contracts.aistack.v1 import events_pb2

Kind = Literal["sensors", "weblogs"]
Format = Literal["json", "protobuf", "log"]
Expected = Literal["clean", "dead_letter", "duplicate"]
Headers = tuple[tuple[str, bytes], ...]

CONTENT_TYPE = "content-type"
CONTENT_TYPES: Mapping[Format, bytes] = {
    "json": b"application/json",
    "protobuf": b"application/x-protobuf",
    "log": b"text/plain",
}


@dataclass(frozen=True)
class RawRecord:
    """One record for aistack.events.raw and what svc_ingest should make of it.

    ``reason`` is the dead-letter reason code when ``expected`` is
    "dead_letter", else "". ``event_id`` is the id the value carries ("" for
    log lines and for values too broken to carry one).
    """

    key: bytes | None
    value: bytes | None
    headers: Headers
    expected: Expected
    reason: str
    event_id: str


# A good event before encoding: faults corrupt its structure, not just bytes.
@dataclass
class JsonDraft:
    key: bytes
    event_id: str
    doc: dict[str, Any]


@dataclass
class ProtoDraft:
    key: bytes
    event_id: str
    message: events_pb2.RawEvent


@dataclass
class LogDraft:
    key: bytes
    line: str
    event_id: str = ""  # a log line has none: svc_ingest hashes the content


Draft = JsonDraft | ProtoDraft | LogDraft


class Source(Protocol):
    """Makes good events of one kind; ``structured`` asks for no log-line body."""

    def draft(self, fmt: Format, *, structured: bool = False) -> Draft: ...


class EventIds:
    """UUID4-shaped ids drawn from the seeded generator, never repeated."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._seen: set[str] = set()

    def next(self) -> str:
        while True:
            event_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
            if event_id not in self._seen:
                self._seen.add(event_id)
                return event_id


def format_of(draft: Draft) -> Format:
    if isinstance(draft, JsonDraft):
        return "json"
    if isinstance(draft, ProtoDraft):
        return "protobuf"
    return "log"


def dump_json(doc: object) -> str:
    # Compact, and °C as UTF-8 rather than \u00b0: what small devices send.
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def encode(draft: Draft) -> bytes:
    if isinstance(draft, JsonDraft):
        return dump_json(draft.doc).encode()
    if isinstance(draft, ProtoDraft):
        # Deterministic: map fields (attributes) in a stable order per seed.
        return draft.message.SerializeToString(deterministic=True)
    return draft.line.encode()


def headers_for(fmt: Format) -> Headers:
    return ((CONTENT_TYPE, CONTENT_TYPES[fmt]),)


def good(draft: Draft, *, with_header: bool = True) -> RawRecord:
    headers = headers_for(format_of(draft)) if with_header else ()
    return RawRecord(draft.key, encode(draft), headers, "clean", "", draft.event_id)


def dead_letter(
    draft: Draft, value: bytes | None, reason: str, *, keeps_id: bool = True
) -> RawRecord:
    """A bad record made from ``draft``; it always says its content type, so the
    reason cannot depend on format detection."""
    event_id = draft.event_id if keeps_id else ""
    return RawRecord(
        draft.key, value, headers_for(format_of(draft)), "dead_letter", reason, event_id
    )
