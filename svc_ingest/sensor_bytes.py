"""The common JSON sensor reading, compiled: raw bytes to a CleanEvent's bytes.

In Python the cleaning of a record (``orjson``, the shape's plan, the
protobuf built field by field and serialised) was most of the worker's time
(docs/benchmarks.md, the cleaner). ``_sensor_bytes.c`` does what
``SensorShapes`` does for the same records, on the bytes: it parses, fills
and writes the CleanEvent's wire format in one pass, with its source
position and ingest time, and hands back the event id, the record key and
the value.

It declines (None) whatever is not plainly the common shape: text other than
printable ASCII without escapes, arrays, float attributes, string times,
anything the Python path would reject. The Python path then decides, so the
outcome of a record is the same with or without it
(tests/unit/test_ingest_sensor_bytes.py holds the two to the same events).
``make setup`` builds it (``python -m svc_ingest.sensor_bytes_build``);
without it, ``compiled`` returns None and every record takes the Python
path, which the worker says once at start-up.

It also makes a fresh trace's traceparent header (``fresh_traceparent``),
what ``shared.bus.envelope.traceparent_header("")`` makes, with a generator
of its own: every clean record of a reading that carried no trace needs one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import Protocol

from shared.bus.envelope import traceparent_header
from svc_ingest.cleaner import Cleaner, content_hash

try:
    from svc_ingest import _sensor_bytes  # type: ignore[attr-defined]
except ImportError:  # not built: the Python path cleans every record
    _sensor_bytes = None

BUILT = _sensor_bytes is not None

#: ``fresh_traceparent()``: a new trace's traceparent header value, as
#: ``traceparent_header("")`` gives it (0.07 against 0.9 µs in process).
fresh_traceparent: Callable[[], bytes] = partial(traceparent_header, "")
if _sensor_bytes is not None:
    fresh_traceparent = _sensor_bytes.fresh_traceparent
    # A forked child must not repeat its parent's ids.
    os.register_at_fork(after_in_child=_sensor_bytes.reseed)
#: CleanEvent.event_id's tag: field 1, length-delimited.
_EVENT_ID_TAG = b"\x0a"


class _Compiled(Protocol):
    def clean(
        self, value: bytes, now_us: int, partition: int, offset: int
    ) -> tuple[str, bytes, bytes] | None: ...


class SensorBytes:
    """The compiled path for one cleaner's rules, writing ``source_topic`` as
    each event's source."""

    __slots__ = ("unhashed",)

    def __init__(self, compiled: _Compiled) -> None:
        #: ``clean`` without the content hash: the event id is '' where the
        #: producer gave none, and ``with_content_hash`` completes the result
        #: (a batch calls it directly, a call fewer a record).
        self.unhashed = compiled.clean

    def clean(
        self, value: bytes, now_us: int, partition: int, offset: int
    ) -> tuple[str, bytes, bytes] | None:
        """(event id, key, serialised CleanEvent) of a JSON record, as the
        Python path builds them with its source position and ingest time
        ``now_us``; None where the Python path must decide."""
        found = self.unhashed(value, now_us, partition, offset)
        if found is None or found[0]:
            return found
        return with_content_hash(value, found)


def with_content_hash(value: bytes, found: tuple[str, bytes, bytes]) -> tuple[str, bytes, bytes]:
    """``SensorBytes.unhashed``'s result for a record whose producer gave no
    id: the content hash, as Cleaner.clean_all gives it, put first as the
    field it is."""
    event_id = content_hash(value)
    _, key, event = found
    return event_id, key, _EVENT_ID_TAG + bytes((len(event_id),)) + event_id.encode() + event


def compiled(cleaner: Cleaner, source_topic: str) -> SensorBytes | None:
    """The compiled path under ``cleaner``'s rules; None where it is not built
    or the rules allow no reading at all (then nothing is the common shape)."""
    rules = cleaner.rules
    if _sensor_bytes is None or rules.max_events < 1:
        return None
    return SensorBytes(
        _sensor_bytes.Cleaner(
            cleaner.measurement_spec,
            source_topic,
            rules.max_payload_bytes,
            rules.max_nesting_depth,
            rules.max_id_length,
            rules.max_metrics,
            rules.max_future_skew_us,
        )
    )
