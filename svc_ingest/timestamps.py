"""Event times as producers write them, normalised to UTC epoch microseconds."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, timezone

from google.protobuf.timestamp_pb2 import Timestamp

from svc_ingest.rejection import RecordRejected

# 1970…2200 in microseconds: anything outside is a unit mix-up, not a time.
_MIN_US = 0
_MAX_US = 7_258_118_400_000_000

# Epoch numbers carry no unit, so the magnitude decides: a time between 1973
# and 5138 is 1e11 seconds at most, so ms, µs and ns follow by factors of 1000.
_SECONDS_BELOW = 1e11
_MS_BELOW = 1e14
_US_BELOW = 1e17
_NS_BELOW = 1e20

_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_CLF_TIME = re.compile(
    r"(\d{2})/([A-Za-z]{3})/(\d{4}):(\d{2}):(\d{2}):(\d{2}) ([+-])(\d{2})(\d{2})"
)
_MONTHS = {
    m: i
    for i, m in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(value: object) -> int:
    """A timestamp as UTC epoch microseconds.

    Accepts ISO 8601 (with an offset, ``Z``, or none, read as UTC), epoch
    seconds, milliseconds, microseconds or nanoseconds (as numbers or numeric
    strings, told apart by magnitude) and the Common Log Format's
    ``10/Oct/2000:13:55:36 -0700``. Raises RecordRejected: ``invalid_type``,
    ``invalid_timestamp``, ``non_finite``.
    """
    if isinstance(value, bool):
        raise RecordRejected(
            "invalid_type", f"timestamp must be a string or a number, got {value!r}"
        )
    if isinstance(value, int | float):
        return _from_epoch(value)
    if not isinstance(value, str):
        raise RecordRejected(
            "invalid_type", f"timestamp must be a string or a number, got {type(value).__name__}"
        )
    text = value.strip()
    if _NUMBER.fullmatch(text):
        return _from_epoch(float(text) if "." in text or "e" in text.lower() else int(text))
    clf = _CLF_TIME.fullmatch(text)
    if clf is not None:
        return _from_clf(clf, value)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise RecordRejected(
            "invalid_timestamp", f"timestamp {value!r} is not ISO 8601 or epoch"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return _checked(_to_us(moment), value)


def _from_epoch(number: int | float) -> int:
    if isinstance(number, float) and not math.isfinite(number):
        raise RecordRejected("non_finite", f"timestamp {number!r} is not finite")
    size = abs(number)
    if size < _SECONDS_BELOW:
        micros = round(number * 1_000_000)
    elif size < _MS_BELOW:
        micros = round(number * 1000)
    elif size < _US_BELOW:
        micros = round(number)
    elif size < _NS_BELOW:
        micros = round(number / 1000)
    else:
        raise RecordRejected("invalid_timestamp", f"epoch timestamp {number!r} is too large")
    return _checked(micros, number)


def _from_clf(match: re.Match[str], raw: str) -> int:
    day, month, year, hour, minute, second, sign, off_h, off_m = match.groups()
    month_no = _MONTHS.get(month.lower())
    if month_no is None:
        raise RecordRejected("invalid_timestamp", f"timestamp {raw!r} has an unknown month")
    offset = timedelta(hours=int(off_h), minutes=int(off_m))
    try:
        moment = datetime(
            int(year),
            month_no,
            int(day),
            int(hour),
            int(minute),
            int(second),
            tzinfo=timezone(-offset if sign == "-" else offset),
        )
    except ValueError as exc:
        raise RecordRejected("invalid_timestamp", f"timestamp {raw!r}: {exc}") from None
    return _checked(_to_us(moment), raw)


def _to_us(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _checked(micros: int, raw: object) -> int:
    if not _MIN_US <= micros <= _MAX_US:
        raise RecordRejected("invalid_timestamp", f"timestamp {raw!r} is outside 1970-2200")
    return micros


def set_timestamp(stamp: Timestamp, micros: int) -> None:
    """``stamp`` := ``micros`` since the epoch. Timestamp.FromMicroseconds is
    pure Python; this is the same, cheaper."""
    stamp.seconds, rest = divmod(micros, 1_000_000)
    stamp.nanos = rest * 1000
