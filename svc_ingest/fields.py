"""Typed reads of producer fields: strings, numbers given as strings, ids."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from svc_ingest.rejection import RecordRejected

# Where JSON producers put the common fields, in order of preference.
EVENT_ID = ("event_id", "eventId", "id")
TIME = (
    "timestamp",
    "ts",
    "time",
    "event_time",
    "eventTime",
    "@timestamp",
    "time_iso8601",
    "time_local",
)
DEVICE = ("device_id", "deviceId", "device")
KIND = ("type", "kind")
# The fields a sensor reading with ``metrics`` uses; the rest become attributes.
SENSOR_KEYS = frozenset((*EVENT_ID, *TIME, *DEVICE, *KIND, "metrics", "attributes"))


def first(doc: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str, Any]:
    """The first of ``names`` present in ``doc`` as (name, value); ("", None) if none."""
    for name in names:
        if name in doc:
            return name, doc[name]
    return "", None


def text(value: Any, field: str) -> str:
    """A string field, trimmed; integers are accepted as their decimal text."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise RecordRejected("invalid_type", f"{field} must be a string, got {_kind(value)}")


def number(value: Any, field: str) -> float:
    """A finite number; numeric strings (``"40.5"``) are converted."""
    if isinstance(value, bool):
        raise RecordRejected("invalid_type", f"{field} must be a number, got a boolean")
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            raise RecordRejected(
                "invalid_type", f"{field} must be a number, got {value!r}"
            ) from None
    else:
        raise RecordRejected("invalid_type", f"{field} must be a number, got {_kind(value)}")
    if not math.isfinite(result):
        raise RecordRejected("non_finite", f"{field} is {value!r}, not a finite number")
    return result


def integer(value: Any, field: str) -> int:
    """A whole number; ``"200"`` and ``200.0`` are accepted, ``200.5`` is not."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    result = number(value, field)
    if not result.is_integer():
        raise RecordRejected("invalid_type", f"{field} must be a whole number, got {value!r}")
    return int(result)


def attribute_value(value: Any) -> str:
    """Any JSON value as an attribute string: text as is, the rest as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def identifier(value: Any, field: str, max_length: int) -> str:
    """A trimmed, lower-cased, printable, non-empty id of bounded length."""
    result = text(value, field).lower()
    if not result:
        raise RecordRejected("missing_field", f"{field} is empty")
    if len(result) > max_length or not result.isprintable():
        raise RecordRejected(
            "invalid_field", f"{field} must be printable and at most {max_length} characters"
        )
    return result


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
