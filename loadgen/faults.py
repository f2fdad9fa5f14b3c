"""Bad records with a known defect, each tagged with the reason svc_ingest gives.

Every function takes a freshly made good draft (never sent as good itself)
and returns a RawRecord expected to be dead-lettered with ``reason``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from google.protobuf.message import DecodeError

from loadgen import timestamps
from loadgen.records import (
    Draft,
    Format,
    JsonDraft,
    Kind,
    LogDraft,
    ProtoDraft,
    RawRecord,
    dead_letter,
    dump_json,
    encode,
)
from shared.contracts.aistack.v1 import events_pb2

# svc_ingest's payload limit is 1 MiB; twice that leaves no doubt. The padding
# repeats so lz4 shrinks the record far below the broker's message size limit.
LARGE_BYTES = 2 * 1024 * 1024 + 4096
MAX_DEPTH = 32
UTF8_BOM = b"\xef\xbb\xbf"
UNKNOWN_UNITS = ("furlongs", "cubits", "smoots")

_JSON_REASONS = (
    "empty",
    "null_value",
    "invalid_utf8",
    "byte_order_mark",
    "invalid_json",
    "duplicate_key",
    "not_an_object",
    "too_deep",
    "non_finite",
    "missing_field",
    "invalid_timestamp",
    "future_timestamp",
    "invalid_type",
)
# Which defects each kind and format can carry. A web event without a host is
# no defect (the record key names it), and units exist only for sensors.
REASONS: Mapping[Kind, Mapping[Format, tuple[str, ...]]] = {
    "sensors": {
        "json": (*_JSON_REASONS, "unknown_unit", "out_of_range"),
        "protobuf": (
            "invalid_protobuf",
            "missing_field",
            "future_timestamp",
            "unknown_unit",
            "out_of_range",
            "non_finite",
        ),
    },
    "weblogs": {
        "json": _JSON_REASONS,
        "protobuf": ("invalid_protobuf", "missing_field", "future_timestamp", "non_finite"),
        "log": ("malformed_log_line", "invalid_utf8", "empty", "null_value"),
    },
}
ALL_REASONS = frozenset(
    {"too_large"} | {r for formats in REASONS.values() for rs in formats.values() for r in rs}
)

_ENTITY: Mapping[Kind, str] = {"sensors": "device_id", "weblogs": "host"}
_TIME: Mapping[Kind, str] = {"sensors": "timestamp", "weblogs": "time"}


def corrupt(reason: str, draft: Draft, kind: Kind, rng: random.Random, now: datetime) -> RawRecord:
    """A record from ``draft`` that svc_ingest rejects with ``reason``.

    Raises ValueError for a reason the draft's format cannot carry.
    """
    if reason == "empty":
        return dead_letter(draft, b"", reason, keeps_id=False)
    if reason == "null_value":
        return dead_letter(draft, None, reason, keeps_id=False)
    if isinstance(draft, JsonDraft):
        json_fault = _JSON_FAULTS.get(reason)
        if json_fault is not None:
            return dead_letter(draft, json_fault(draft, kind, rng, now), reason)
    elif isinstance(draft, ProtoDraft):
        if reason == "invalid_protobuf":
            return dead_letter(draft, _garbage(draft, rng), reason, keeps_id=False)
        proto_fault = _PROTO_FAULTS.get(reason)
        if proto_fault is not None:
            proto_fault(draft.message, rng, now)
            return dead_letter(draft, encode(draft), reason)
    else:
        log_fault = _LOG_FAULTS.get(reason)
        if log_fault is not None:
            return dead_letter(draft, log_fault(draft, rng), reason)
    raise ValueError(f"no {reason!r} fault for a {type(draft).__name__}")


def oversize(draft: JsonDraft) -> RawRecord:
    """Valid JSON padded past the payload limit: reason ``too_large``."""
    draft.doc["debug_dump"] = "0123456789abcdef" * (LARGE_BYTES // 16)
    return dead_letter(draft, encode(draft), "too_large")


# JSON ------------------------------------------------------------------------

JsonFault = Callable[[JsonDraft, Kind, random.Random, datetime], bytes]


def _invalid_utf8(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    if rng.random() < 0.5:
        return b"\xff\xfe" + dump_json(draft.doc).encode()
    # A Latin-1 producer: "é" as the single byte 0xE9.
    draft.doc["location"] = "Café du Nord"
    return dump_json(draft.doc).encode().replace("é".encode(), b"\xe9")


def _bom(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    return UTF8_BOM + dump_json(draft.doc).encode()


def _invalid_json(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    text = dump_json(draft.doc)
    if rng.random() < 0.5:
        return text[:-1].encode() + b",}"  # a trailing comma
    # Cut on characters, not bytes, so the bytes stay valid UTF-8.
    return text[: rng.randrange(1, len(text) - 1)].encode()


def _duplicate_key(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    name = _ENTITY[kind]
    first = dump_json({name: f"{draft.key.decode()}-twin"})[:-1]
    return (first + "," + dump_json(draft.doc)[1:]).encode()


def _not_an_object(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    shape = rng.choice((lambda: [draft.doc], lambda: 42, lambda: draft.key.decode()))
    return dump_json(shape()).encode()


def _too_deep(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    nested: dict[str, Any] = {"leaf": True}
    for _ in range(MAX_DEPTH + 8):
        nested = {"child": nested}
    draft.doc.setdefault("attributes", {})["trace"] = nested
    return dump_json(draft.doc).encode()


def _non_finite(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    # json.dumps writes NaN and Infinity as the bare literals JSON forbids.
    number = rng.choice((math.nan, math.inf, -math.inf))
    if kind == "sensors":
        _metric_entries(draft.doc)[0]["value"] = number
    else:
        draft.doc.pop("request_time", None)
        draft.doc["latency_ms"] = number
    return dump_json(draft.doc).encode()


def _missing_field(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    # Web: a missing host falls back to the record key, so drop time or status.
    other = "device_id" if kind == "sensors" else "status"
    del draft.doc[rng.choice((_TIME[kind], other))]
    return dump_json(draft.doc).encode()


def _invalid_timestamp(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    draft.doc[_TIME[kind]] = rng.choice(("yesterday-ish", "2026-13-45T99:99:99", "last tuesday"))
    return dump_json(draft.doc).encode()


def _future_timestamp(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    field = _TIME[kind]
    draft.doc[field] = timestamps.like(draft.doc[field], timestamps.future(rng, now))
    return dump_json(draft.doc).encode()


def _invalid_type(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    if kind == "sensors":
        _metric_entries(draft.doc)[0]["value"] = {"a": 1}
    else:
        draft.doc["status"] = "abc"
    return dump_json(draft.doc).encode()


def _unknown_unit(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    _metric_entries(draft.doc)[0]["unit"] = rng.choice(UNKNOWN_UNITS)
    return dump_json(draft.doc).encode()


def _out_of_range(draft: JsonDraft, kind: Kind, rng: random.Random, now: datetime) -> bytes:
    metric, value, unit = _impossible(rng)
    metrics = draft.doc["metrics"]
    if isinstance(metrics, dict):
        metrics[metric] = {"value": value, "unit": unit}
    else:
        kept = [m for m in metrics if m["name"] != metric]
        draft.doc["metrics"] = [*kept, {"name": metric, "value": value, "unit": unit}]
    return dump_json(draft.doc).encode()


def _metric_entries(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The metric objects of a sensor doc, whichever shape ``metrics`` has."""
    metrics = doc["metrics"]
    return list(metrics.values()) if isinstance(metrics, dict) else list(metrics)


def _impossible(rng: random.Random) -> tuple[str, float, str]:
    return rng.choice((("temperature", 900.0, "°C"), ("humidity", 150.0, "%")))


_JSON_FAULTS: Mapping[str, JsonFault] = {
    "invalid_utf8": _invalid_utf8,
    "byte_order_mark": _bom,
    "invalid_json": _invalid_json,
    "duplicate_key": _duplicate_key,
    "not_an_object": _not_an_object,
    "too_deep": _too_deep,
    "non_finite": _non_finite,
    "missing_field": _missing_field,
    "invalid_timestamp": _invalid_timestamp,
    "future_timestamp": _future_timestamp,
    "invalid_type": _invalid_type,
    "unknown_unit": _unknown_unit,
    "out_of_range": _out_of_range,
}

# Protobuf --------------------------------------------------------------------

ProtoFault = Callable[[events_pb2.RawEvent, random.Random, datetime], None]


def is_invalid_protobuf(value: bytes) -> bool:
    """True when ``value`` is no RawEvent with a body."""
    try:
        event = events_pb2.RawEvent.FromString(value)
    except DecodeError:
        return True
    return event.WhichOneof("body") is None


def _garbage(draft: ProtoDraft, rng: random.Random) -> bytes:
    """A truncated RawEvent or random bytes, checked not to parse by accident."""
    whole = encode(draft)
    while True:
        if rng.random() < 0.5:
            value = whole[: rng.randrange(1, len(whole))]
        else:
            value = rng.randbytes(rng.randrange(8, 64))
        if is_invalid_protobuf(value):
            return value


def _proto_missing(message: events_pb2.RawEvent, rng: random.Random, now: datetime) -> None:
    if message.HasField("sensor_reading") and rng.random() < 0.5:
        message.sensor_reading.device_id = ""
    else:
        message.ClearField("event_time")


def _proto_future(message: events_pb2.RawEvent, rng: random.Random, now: datetime) -> None:
    message.event_time.FromMicroseconds(timestamps.epoch_us(timestamps.future(rng, now)))


def _proto_unit(message: events_pb2.RawEvent, rng: random.Random, now: datetime) -> None:
    message.sensor_reading.measurements[0].unit = rng.choice(UNKNOWN_UNITS)


def _proto_range(message: events_pb2.RawEvent, rng: random.Random, now: datetime) -> None:
    metric, value, unit = _impossible(rng)
    for measurement in message.sensor_reading.measurements:
        if measurement.metric == metric:
            measurement.value, measurement.unit = value, unit
            return
    message.sensor_reading.measurements.add(metric=metric, value=value, unit=unit)


def _proto_non_finite(message: events_pb2.RawEvent, rng: random.Random, now: datetime) -> None:
    number = rng.choice((math.nan, math.inf))
    if message.HasField("sensor_reading"):
        message.sensor_reading.measurements[0].value = number
    else:
        message.web_request.latency_ms = number


_PROTO_FAULTS: Mapping[str, ProtoFault] = {
    "missing_field": _proto_missing,
    "future_timestamp": _proto_future,
    "unknown_unit": _proto_unit,
    "out_of_range": _proto_range,
    "non_finite": _proto_non_finite,
}

# Log lines -------------------------------------------------------------------


def _malformed_line(draft: LogDraft, rng: random.Random) -> bytes:
    line = draft.line
    variant = rng.randrange(4)
    if variant == 0:  # cut inside the [time] field, as a crashed writer leaves it
        return line[: line.index("[") + 6].encode()
    if variant == 1:  # the request without its quotes
        start, end = line.index('"'), line.index('"', line.index('"') + 1)
        return (line[:start] + line[start + 1 : end] + line[end + 1 :]).encode()
    if variant == 2:  # a status that is not three digits
        head, _, tail = line.partition('" ')
        return f'{head}" OK {tail.split(" ", 1)[1]}'.encode()
    return f"{draft.key.decode()} nginx[{rng.randrange(100, 9999)}]: upstream timed out".encode()


def _latin1_line(draft: LogDraft, rng: random.Random) -> bytes:
    # A Latin-1 user agent: "é" as the single byte 0xE9.
    head, _, _ = draft.line.rpartition(' "')
    return (head + ' "Mozilla/5.0 (compatible; Caf').encode() + b'\xe9Bot/1.0)"'


_LOG_FAULTS: Mapping[str, Callable[[LogDraft, random.Random], bytes]] = {
    "malformed_log_line": _malformed_line,
    "invalid_utf8": _latin1_line,
}
