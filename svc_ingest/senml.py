"""SenML (RFC 8428) JSON packs, resolved into one record per reading.

Base fields (``bn``, ``bt``, ``bu``, ``bv``, ``bver``) apply to their record
and every later one until replaced, as RFC 8428 §4.1 says. Each record is
resolved (§4.6): name ``bn + n``, time ``bt + t``, unit ``u`` or ``bu``, value
``bv + v`` (or ``vs``, ``vb``, ``vd``).

The entity is the device the name belongs to (``entity_and_metric``). Times
are seconds; a resolved time under 2**28 is relative to now (§4.5.3).
Raises RecordRejected with the index of the record at fault.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from svc_ingest.rejection import RecordRejected

# RFC 8428 §4.5.3: smaller resolved times are seconds relative to now.
RELATIVE_BELOW = 2**28
SUPPORTED_VERSION = 10
_MAX_US = 7_258_118_400_000_000  # 2200, as svc_ingest.timestamps
# §4.5.1: the resolved name's characters, starting with a letter or digit.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9:./_-]*")
_SEPARATORS = ":/"
_BASE = frozenset({"bn", "bt", "bu", "bv", "bver"})
_RECORD = frozenset({"n", "u", "v", "vs", "vb", "vd", "t"})
_SUMS = frozenset({"s", "bs"})

SenmlValue = float | bool | str


@dataclass(frozen=True, slots=True)
class Record:
    index: int
    name: str  # the resolved name, bn + n
    entity: str  # "" when the name has no device part
    metric: str
    unit: str
    # A number (v, plus bv), a boolean (vb) or text (vs, and vd as base64 text).
    value: SenmlValue
    time_us: int
    # Labels RFC 8428 lets a reader skip (e.g. ``ut``), kept as sent.
    extra: dict[str, Any] = field(default_factory=dict)


def resolve(pack: list[Any], now_us: int) -> list[Record]:
    """The resolved records of a pack, in order."""
    if not pack:
        raise RecordRejected("missing_field", "SenML pack is empty")
    base_name, base_unit = "", ""
    base_time = base_value = 0.0
    records = []
    for index, entry in enumerate(pack):
        if not isinstance(entry, dict):
            raise RecordRejected("not_an_object", f"SenML record {index} is not an object")
        try:
            if "bver" in entry:
                _version(entry["bver"])
            if "bn" in entry:
                base_name = _text(entry["bn"], "bn")
            if "bt" in entry:
                base_time = _number(entry["bt"], "bt")
            if "bu" in entry:
                base_unit = _text(entry["bu"], "bu")
            if "bv" in entry:
                base_value = _number(entry["bv"], "bv")
            if entry.keys() <= _BASE:
                continue  # base fields alone: they hold for the records after
            records.append(
                _record(index, entry, base_name, base_unit, base_time, base_value, now_us)
            )
        except RecordRejected as rejected:
            raise RecordRejected(
                rejected.reason, f"SenML record {index}: {rejected.message}"
            ) from None
    if not records:
        raise RecordRejected("missing_field", "SenML pack holds base fields but no record")
    return records


def entity_and_metric(base_name: str, own_name: str) -> tuple[str, str]:
    """Split a resolved name into the device it names and the metric.

    With both ``bn`` and ``n``, the base name is the device (its trailing
    ``:``, ``/`` or ``.`` dropped) and ``n`` the metric. With only one, the
    name splits at its last ``:`` or ``/``: ``urn:dev:ow:10e2073a01080063:temp``
    is device ``urn:dev:ow:10e2073a01080063``, metric ``temp``. A name with
    no separator is a metric alone (entity ""). ``/`` and ``:`` left inside
    a metric become ``.``.
    """
    if base_name and own_name:
        entity, metric = base_name.rstrip(":/."), own_name
    else:
        whole = base_name + own_name
        cut = max(whole.rfind(sep) for sep in _SEPARATORS)
        entity, metric = (whole[:cut], whole[cut + 1 :]) if cut >= 0 else ("", whole)
    return entity, metric.replace("/", ".").replace(":", ".")


def _record(
    index: int,
    entry: dict[str, Any],
    base_name: str,
    base_unit: str,
    base_time: float,
    base_value: float,
    now_us: int,
) -> Record:
    extra = {}
    for label, item in entry.items():
        if label in _SUMS:
            raise RecordRejected("invalid_field", "sums (s, bs) are not supported")
        if label.endswith("_"):
            # §4.4: a label ending in "_" must be understood, or the pack rejected.
            raise RecordRejected("invalid_field", f"label {label!r} is not understood")
        if label not in _BASE and label not in _RECORD:
            extra[label] = item
    own_name = _text(entry["n"], "n") if "n" in entry else ""
    name = base_name + own_name
    if not name:
        raise RecordRejected("missing_field", "record has no name (bn + n)")
    if not _NAME.fullmatch(name):
        raise RecordRejected("invalid_field", f"name {name[:80]!r} is not a SenML name")
    entity, metric = entity_and_metric(base_name, own_name)
    if not metric:
        raise RecordRejected("missing_field", f"name {name[:80]!r} names no metric")
    unit = _text(entry["u"], "u") if "u" in entry else base_unit
    given = [label for label in ("v", "vs", "vb", "vd") if label in entry]
    if len(given) != 1:
        raise RecordRejected(
            "missing_field" if not given else "invalid_field",
            "record must hold exactly one of v, vs, vb, vd",
        )
    kind = given[0]
    value: SenmlValue
    if kind == "v":
        value = base_value + _number(entry["v"], "v")
    elif kind == "vb":
        if not isinstance(entry["vb"], bool):
            raise RecordRejected("invalid_type", "vb must be a boolean")
        value = entry["vb"]
    else:
        value = _text(entry[kind], kind)
    seconds = base_time + (_number(entry["t"], "t") if "t" in entry else 0.0)
    return Record(index, name, entity, metric, unit, value, _time_us(seconds, now_us), extra)


def _time_us(seconds: float, now_us: int) -> int:
    if abs(seconds) * 1_000_000 > _MAX_US:
        raise RecordRejected("invalid_timestamp", f"time {seconds!r} s is outside 1970-2200")
    if seconds < RELATIVE_BELOW:
        return now_us + round(seconds * 1_000_000)
    return round(seconds * 1_000_000)


def _version(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordRejected("invalid_type", "bver must be an integer")
    if value > SUPPORTED_VERSION:
        raise RecordRejected(
            "invalid_field", f"SenML version {value} is newer than {SUPPORTED_VERSION}"
        )


def _text(value: Any, label: str) -> str:
    if not isinstance(value, str):
        raise RecordRejected("invalid_type", f"{label} must be a string")
    return value


def _number(value: Any, label: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordRejected("invalid_type", f"{label} must be a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise RecordRejected("non_finite", f"{label} is not a finite number")
    return number
