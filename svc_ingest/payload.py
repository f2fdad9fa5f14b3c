"""From a raw record's bytes to a JSON object or SenML pack, a RawEvent or text.

The ``content-type`` header decides; without one, the bytes do: a JSON
document starts with ``{`` or ``[`` after blanks, a log line is printable
text, anything else is tried as protobuf (then as lines of text). A JSON
array is a SenML pack (RFC 8428) when its first record has a name (``bn`` or
``n``) or the content type says ``application/senml+json``; any other array
is ``not_an_object``. Text is one or more lines: access-log lines or InfluxDB
line protocol, told apart by the cleaner.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
from google.protobuf.message import DecodeError

from shared.contracts.aistack.v1 import events_pb2
from svc_ingest.rejection import RecordRejected
from svc_ingest.rules import CleaningRules

# A JSON object, a SenML pack, a RawEvent, or printable lines of text.
Payload = dict[str, Any] | list[Any] | events_pb2.RawEvent | str

JSON_TYPES = frozenset({"application/json", "text/json", "application/cloudevents+json"})
PROTOBUF_TYPES = frozenset(
    {"application/x-protobuf", "application/protobuf", "application/vnd.google.protobuf"}
)
TEXT_TYPES = frozenset({"text/plain", "text/x-log"})
SENML_TYPES = frozenset({"application/senml+json"})

_BOM = b"\xef\xbb\xbf"
_JSON_STARTS = frozenset(b"{[")
_BLANKS = b" \t\r\n"


class _DuplicateKeyError(Exception):
    pass


class _NonFiniteError(Exception):
    pass


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _DuplicateKeyError(dup)
    return obj


def _finite(text: str) -> float:
    number = float(text)
    if number - number != 0.0:  # inf - inf and nan - nan are nan
        raise _NonFiniteError(text)
    return number


def _constant(name: str) -> float:
    raise _NonFiniteError(name)


_decoder = json.JSONDecoder(
    object_pairs_hook=_object, parse_float=_finite, parse_constant=_constant
)


def decode(value: bytes | None, content_type: str, rules: CleaningRules) -> Payload:
    """The payload of one raw record; raises RecordRejected with the reason."""
    if value is None:
        raise RecordRejected("null_value", "record has no value (a tombstone)")
    if not value:
        raise RecordRejected("empty", "record value is empty")
    if len(value) > rules.max_payload_bytes:
        raise RecordRejected(
            "too_large",
            f"record value is {len(value)} bytes, over the limit of {rules.max_payload_bytes}",
        )
    kind = _media_type(content_type)
    if kind in JSON_TYPES:
        return decode_json(value, rules)
    if kind in PROTOBUF_TYPES:
        return decode_protobuf(value)
    if kind in TEXT_TYPES:
        return decode_text(value)
    if kind in SENML_TYPES:
        return decode_json(value, rules, senml=True)
    if kind:
        raise RecordRejected(
            "unsupported_content_type",
            f"content-type {kind!r} is not JSON, SenML JSON, protobuf or text",
        )
    return _detect(value, rules)


def reads_as_json_object(content_type: str) -> bool:
    """Whether ``decode`` reads a value under ``content_type`` as JSON (not
    SenML) when it starts with ``{``: a JSON media type, or none at all."""
    kind = _media_type(content_type)
    return not kind or kind in JSON_TYPES


def _media_type(content_type: str) -> str:
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def _detect(value: bytes, rules: CleaningRules) -> Payload:
    if value.startswith(_BOM):
        return decode_json(value, rules)
    first = value.lstrip(_BLANKS)[:1]
    if first and first[0] in _JSON_STARTS:
        return decode_json(value, rules)
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        try:
            return decode_protobuf(value)
        except RecordRejected:
            if _mostly_text(value):
                raise RecordRejected("invalid_utf8", f"value is not valid UTF-8: {exc}") from None
            raise
    if text.isprintable():
        return _line(text)
    # Protobuf bytes are rarely valid UTF-8 with no control characters, and
    # text with control characters is no log line: try protobuf, then say why
    # in terms of a log line, the likelier intent of a text producer.
    try:
        return decode_protobuf(value)
    except RecordRejected:
        return _lines(text)


def _mostly_text(value: bytes) -> bool:
    sample = value[:512]
    printable = sum(32 <= b < 127 for b in sample)
    return printable * 10 >= len(sample) * 9


def decode_json(
    value: bytes, rules: CleaningRules, *, senml: bool = False
) -> dict[str, Any] | list[Any]:
    """A JSON object or SenML pack, or RecordRejected with the precise reason.

    ``senml``: the content type said SenML, so only an array will do.

    orjson parses the common case; it cannot see duplicate keys (the last one
    wins), so its result counts only when the document holds exactly as many
    ``"…":`` key ends as the parse has keys. Anything it refuses, and any
    mismatch, goes to the strict parser, which names what is wrong.
    """
    if value.count(b"{") + value.count(b"[") <= rules.max_nesting_depth:
        try:
            document = orjson.loads(value)
        except orjson.JSONDecodeError:
            pass
        else:
            _check_shape(document, senml)
            keys = _count_keys(document)
            # A key end is '":' unless the producer puts blanks before the colon.
            if keys == value.count(b'":') or keys == len(_KEY_END.findall(value)):
                return document  # type: ignore[no-any-return]
    return _decode_json_strictly(value, rules, senml)


def _check_shape(document: Any, senml: bool) -> None:
    if senml:
        if not isinstance(document, list):
            raise RecordRejected(
                "not_an_object", f"a SenML pack is a JSON array, got {_json_kind(document)}"
            )
        return
    if isinstance(document, dict) or is_senml_pack(document):
        return
    raise RecordRejected(
        "not_an_object", f"JSON value must be an object, got {_json_kind(document)}"
    )


def is_senml_pack(document: Any) -> bool:
    """An array whose first record names something: RFC 8428 requires every
    resolved record to have a name, so the first one has ``bn`` or ``n``."""
    return (
        isinstance(document, list)
        and bool(document)
        and isinstance(document[0], dict)
        and ("bn" in document[0] or "n" in document[0])
    )


_KEY_END = re.compile(rb'"\s*:')


def _count_keys(node: Any) -> int:
    count = 0
    if type(node) is dict:
        count = len(node)
        children: Any = node.values()
    else:
        children = node
    for child in children:
        kind = type(child)
        if kind is dict or kind is list:
            count += _count_keys(child)
    return count


def _utf8(value: bytes, what: str) -> str:
    """Text without a byte-order mark (RFC 8259 forbids one in JSON)."""
    if value.startswith(_BOM):
        raise RecordRejected("byte_order_mark", f"{what} must not start with a byte-order mark")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordRejected("invalid_utf8", f"value is not valid UTF-8: {exc}") from None


def _decode_json_strictly(
    value: bytes, rules: CleaningRules, senml: bool
) -> dict[str, Any] | list[Any]:
    text = _utf8(value, "JSON")
    # The exact depth walk only runs when the bracket count allows deep nesting.
    if value.count(b"{") + value.count(b"[") > rules.max_nesting_depth:
        _check_depth(text, rules.max_nesting_depth)
    try:
        document = _decoder.decode(text)
    except _DuplicateKeyError as exc:
        raise RecordRejected(
            "duplicate_key", f"JSON object has key {exc.args[0]!r} twice"
        ) from None
    except _NonFiniteError as exc:
        raise RecordRejected(
            "non_finite", f"JSON holds a non-finite number {exc.args[0]!r}"
        ) from None
    except RecursionError:
        raise RecordRejected("too_deep", "JSON nesting is too deep") from None
    except ValueError as exc:
        raise RecordRejected("invalid_json", f"value is not valid JSON: {exc}") from None
    _check_shape(document, senml)
    return document  # type: ignore[no-any-return]


def _check_depth(text: str, limit: int) -> None:
    """Bracket depth outside strings, without building anything."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
            if depth > limit:
                raise RecordRejected("too_deep", f"JSON nesting is deeper than {limit} levels")
        elif char in "}]":
            depth -= 1


def _json_kind(document: object) -> str:
    if isinstance(document, list):
        return "an array"
    if isinstance(document, str):
        return "a string"
    if document is None:
        return "null"
    if isinstance(document, bool):
        return "a boolean"
    return "a number"


def decode_protobuf(value: bytes) -> events_pb2.RawEvent:
    try:
        event = events_pb2.RawEvent.FromString(value)
    except DecodeError as exc:
        raise RecordRejected(
            "invalid_protobuf", f"value is not an aistack.v1.RawEvent: {exc}"
        ) from None
    if event.WhichOneof("body") is None:
        raise RecordRejected(
            "invalid_protobuf", "RawEvent has no body (sensor_reading, web_request or log_line)"
        )
    return event


def decode_text(value: bytes) -> str:
    return _lines(_utf8(value, "text"))


def _lines(text: str) -> str:
    """One or more lines of printable text (``\n`` or ``\r\n`` between them)."""
    if "\n" not in text.rstrip("\r\n"):
        return _line(text)
    body = text.rstrip("\r\n")
    for number, line in enumerate(body.split("\n"), 1):
        if not line.rstrip("\r").isprintable():
            raise RecordRejected(
                "malformed_log_line", f"line {number} is not one line of printable text"
            )
    return body


def _line(text: str) -> str:
    line = text.rstrip("\r\n")
    if not line.isprintable():
        raise RecordRejected("malformed_log_line", "a log line is one line of printable text")
    return line
