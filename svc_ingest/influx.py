"""InfluxDB line protocol and Telegraf's JSON metrics, as points.

A point is what both formats carry: a measurement, tags, typed fields and a
time. Turning points into clean events (entity, metric names, units) is the
cleaner's; this module only reads the formats, and raises RecordRejected
(``malformed_line_protocol``, ``missing_field``, ``invalid_type``,
``duplicate_key``) with the line or metric that is wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from svc_ingest.rejection import RecordRejected

FieldValue = float | bool | str


@dataclass(frozen=True, slots=True)
class Point:
    measurement: str
    tags: dict[str, str]
    # Numbers (integers included) as floats, booleans as bools, strings as str.
    fields: dict[str, FieldValue]
    # As sent: epoch nanoseconds from line protocol, Telegraf's JSON value
    # otherwise; None when the line has no timestamp.
    time: Any


MALFORMED = "malformed_line_protocol"

_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+[iu]")
_TIMESTAMP = re.compile(r"-?\d{1,30}")
_TRUE = frozenset({"t", "T", "true", "True", "TRUE"})
_FALSE = frozenset({"f", "F", "false", "False", "FALSE"})
_KEY_ESCAPES = frozenset(",= \\")
_MEASUREMENT_ESCAPES = frozenset(", \\")


def parse_line(line: str) -> Point:
    """``measurement[,tag=v…] field=v[,field=v…] [timestamp]``; escapes as InfluxDB's."""
    series_end = _unescaped(line, 0, " ")
    if series_end < 0:
        raise RecordRejected(MALFORMED, f"no fields after the measurement: {_shown(line)}")
    fields_end = _fields_end(line, series_end + 1)
    series = _split(line[:series_end], ",")
    measurement = _unescape(series[0], _MEASUREMENT_ESCAPES)
    if not measurement:
        raise RecordRejected(MALFORMED, f"no measurement name: {_shown(line)}")
    tags: dict[str, str] = {}
    for pair in series[1:]:
        key, value = _pair(pair, line)
        if not value:
            raise RecordRejected(MALFORMED, f"tag {key!r} has no value")
        if key in tags:
            raise RecordRejected("duplicate_key", f"tag {key!r} appears twice")
        tags[key] = _unescape(value, _KEY_ESCAPES)
    fields: dict[str, FieldValue] = {}
    for pair in _split(line[series_end + 1 : fields_end], ",", quotes=True):
        key, raw = _pair(pair, line)
        if key in fields:
            raise RecordRejected("duplicate_key", f"field {key!r} appears twice")
        fields[key] = _field_value(key, raw)
    stamp = line[fields_end:].strip()
    if not stamp:
        return Point(measurement, tags, fields, None)
    if not _TIMESTAMP.fullmatch(stamp):
        raise RecordRejected(MALFORMED, f"timestamp {stamp[:40]!r} is not an integer")
    return Point(measurement, tags, fields, int(stamp))


def telegraf_points(doc: Mapping[str, Any]) -> list[Point]:
    """Telegraf's JSON serializer output: one metric, or ``{"metrics": [...]}``."""
    batch = doc.get("metrics")
    if "fields" not in doc and isinstance(batch, list):
        points = []
        for index, entry in enumerate(batch):
            if not isinstance(entry, dict):
                raise RecordRejected("invalid_type", f"metrics[{index}] must be an object")
            try:
                points.append(telegraf_point(entry))
            except RecordRejected as rejected:
                raise RecordRejected(
                    rejected.reason, f"metrics[{index}]: {rejected.message}"
                ) from None
        return points
    return [telegraf_point(doc)]


def telegraf_point(doc: Mapping[str, Any]) -> Point:
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        raise RecordRejected("missing_field", "Telegraf metric has no name")
    tags = doc.get("tags", {})
    if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
        raise RecordRejected("invalid_type", "Telegraf tags must be an object of strings")
    given = doc.get("fields")
    if not isinstance(given, dict):
        raise RecordRejected("invalid_type", "Telegraf fields must be an object")
    fields: dict[str, FieldValue] = {}
    for key, value in given.items():
        if isinstance(value, bool | str):
            fields[key] = value
        elif isinstance(value, int | float):
            try:
                number = float(value)
            except OverflowError:
                number = math.inf
            if not math.isfinite(number):
                raise RecordRejected("non_finite", f"field {key!r} is not a finite number")
            fields[key] = number
        else:
            raise RecordRejected(
                "invalid_type", f"field {key!r} must be a number, boolean or string"
            )
    if "timestamp" not in doc:
        raise RecordRejected("missing_field", "Telegraf metric has no timestamp")
    return Point(name.strip(), dict(tags), fields, doc["timestamp"])


def _field_value(key: str, raw: str) -> FieldValue:
    if raw.startswith('"'):
        if len(raw) < 2 or not raw.endswith('"') or _ends_escaped(raw):
            raise RecordRejected(MALFORMED, f"field {key!r} has an unclosed string")
        return raw[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if _INTEGER.fullmatch(raw):
        if raw.endswith("u") and raw.startswith("-"):
            raise RecordRejected(MALFORMED, f"field {key!r}: an unsigned integer is negative")
        try:
            return float(int(raw[:-1]))
        except (OverflowError, ValueError):  # past float, or past int()'s digit limit
            raise RecordRejected("non_finite", f"field {key!r} is too large") from None
    if _FLOAT.fullmatch(raw):
        number = float(raw)
        if not math.isfinite(number):
            raise RecordRejected("non_finite", f"field {key!r} is not a finite number")
        return number
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise RecordRejected(MALFORMED, f"field {key!r} has value {raw[:40]!r}, of no known type")


def _ends_escaped(raw: str) -> bool:
    """Whether the closing quote of a string field is itself escaped."""
    backslashes = len(raw[:-1]) - len(raw[:-1].rstrip("\\"))
    return backslashes % 2 == 1


def _pair(pair: str, line: str) -> tuple[str, str]:
    at = _unescaped(pair, 0, "=")
    if at <= 0:
        raise RecordRejected(MALFORMED, f"{pair[:40]!r} is not key=value: {_shown(line)}")
    return _unescape(pair[:at], _KEY_ESCAPES), pair[at + 1 :]


def _unescaped(text: str, start: int, char: str) -> int:
    """Index of the first ``char`` at or after ``start`` not escaped by a backslash; -1 if none."""
    at = start
    while at < len(text):
        found = text[at]
        if found == "\\":
            at += 2
            continue
        if found == char:
            return at
        at += 1
    return -1


def _fields_end(line: str, start: int) -> int:
    """Where the field set ends: the first unescaped space outside a string."""
    at, quoted = start, False
    while at < len(line):
        char = line[at]
        if char == "\\":
            at += 2
            continue
        if char == '"':
            quoted = not quoted
        elif char == " " and not quoted:
            return at
        at += 1
    if quoted:
        raise RecordRejected(MALFORMED, f"a string field is not closed: {_shown(line)}")
    return len(line)


def _split(text: str, sep: str, *, quotes: bool = False) -> list[str]:
    parts, begin, at, quoted = [], 0, 0, False
    while at < len(text):
        char = text[at]
        if char == "\\":
            at += 2
            continue
        if quotes and char == '"':
            quoted = not quoted
        elif char == sep and not quoted:
            parts.append(text[begin:at])
            begin = at + 1
        at += 1
    parts.append(text[begin:])
    return parts


def _unescape(text: str, escapable: frozenset[str]) -> str:
    if "\\" not in text:
        return text
    out, at = [], 0
    while at < len(text):
        char = text[at]
        if char == "\\" and at + 1 < len(text) and text[at + 1] in escapable:
            out.append(text[at + 1])
            at += 2
        else:
            out.append(char)
            at += 1
    return "".join(out)


def _shown(line: str) -> str:
    return repr(line if len(line) <= 120 else line[:117] + "...")
