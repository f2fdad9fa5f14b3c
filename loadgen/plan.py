"""A run's records: exact counts of good, bad and duplicate, in a seeded order."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal

from loadgen import faults, timestamps
from loadgen.records import EventIds, Format, JsonDraft, Kind, RawRecord, Source, good
from loadgen.sensors import SensorSource
from loadgen.weblogs import WebSource
from shared.errors import InvalidArgument

FORMATS = ("json", "protobuf", "log", "mixed")
# The share of each format in "mixed": sensors rarely write log lines at all.
_MIXED: dict[str, tuple[tuple[Format, ...], tuple[float, ...]]] = {
    "sensors": (("json", "protobuf"), (0.7, 0.3)),
    "weblogs": (("json", "log", "protobuf"), (0.4, 0.4, 0.2)),
}
# In "mixed", this share of good records has no content-type: svc_ingest must
# tell the format from the bytes.
BARE_SHARE = 0.2


def generate(
    kind: Literal["sensors", "weblogs"],
    count: int,
    *,
    bad_fraction: float = 0.0,
    duplicate_fraction: float = 0.0,
    fmt: str = "mixed",
    seed: int = 0,
    now: datetime | None = None,
    allow_large: bool = True,
    span_seconds: float = timestamps.DEFAULT_SPAN_SECONDS,
    shift: Mapping[str, float] | None = None,
) -> list[RawRecord]:
    """Exactly ``count`` records for aistack.events.raw.

    ``round(count * bad_fraction)`` are dead letters (a spread of reasons;
    ``too_large`` at most once per 1000 records, only when ``allow_large``),
    ``round(count * duplicate_fraction)`` are exact re-sends of an earlier good
    record, the rest are good with unique event ids. Event times lie in the
    ``span_seconds`` (an hour) before ``now`` (default: the current time).
    ``shift`` (sensors only) adds to each named metric's readings in its
    canonical unit (°C for temperature): a distribution that drifted. The
    same arguments give the same records. Raises InvalidArgument for
    impossible arguments.
    """
    if not (math.isfinite(span_seconds) and span_seconds >= 1.0):
        raise InvalidArgument(f"span must be at least one second, got {span_seconds}")
    if shift and kind != "sensors":
        raise InvalidArgument("a shift applies to sensor readings only")
    formats, weights = _formats(kind, fmt)
    n_bad, n_dup = _counts(count, bad_fraction, duplicate_fraction)
    moment = datetime.now(UTC) if now is None else now
    if moment.tzinfo is None:
        raise InvalidArgument("now must be timezone-aware")
    rng = random.Random(seed)
    ids = EventIds(rng)
    source: Source = (
        SensorSource(rng, moment, ids, span_seconds=span_seconds, shift=shift)
        if kind == "sensors"
        else WebSource(rng, moment, ids, span_seconds=span_seconds)
    )

    originals = [
        good(
            source.draft(rng.choices(formats, weights)[0]),
            with_header=fmt != "mixed" or rng.random() >= BARE_SHARE,
        )
        for _ in range(count - n_bad - n_dup)
    ]
    large = min(count // 1000, n_bad // 10) if allow_large and "json" in formats else 0
    originals += _bad(kind, formats, source, rng, moment, n_bad, large)
    rng.shuffle(originals)
    return _with_duplicates(originals, n_dup, rng)


def _formats(kind: str, fmt: str) -> tuple[tuple[Format, ...], tuple[float, ...]]:
    if kind not in _MIXED:
        raise InvalidArgument(f"kind must be sensors or weblogs, got {kind!r}")
    if fmt not in FORMATS:
        raise InvalidArgument(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    choices, weights = _MIXED[kind]
    if fmt == "mixed":
        return choices, weights
    if fmt not in choices:
        raise InvalidArgument(f"{kind} have no {fmt} format")
    return tuple(f for f in choices if f == fmt), (1.0,)


def _counts(count: int, bad_fraction: float, duplicate_fraction: float) -> tuple[int, int]:
    if count < 0:
        raise InvalidArgument(f"count must be >= 0, got {count}")
    for name, share in (("bad fraction", bad_fraction), ("duplicate fraction", duplicate_fraction)):
        if not (math.isfinite(share) and 0.0 <= share <= 1.0):
            raise InvalidArgument(f"{name} must be between 0 and 1, got {share}")
    n_bad, n_dup = round(count * bad_fraction), round(count * duplicate_fraction)
    if n_bad + n_dup > count:
        raise InvalidArgument(f"{n_bad} bad and {n_dup} duplicate records exceed count {count}")
    if n_dup and n_bad + n_dup == count:
        raise InvalidArgument("duplicates need at least one good record to repeat")
    return n_bad, n_dup


def _bad(
    kind: Kind,
    formats: tuple[Format, ...],
    source: Source,
    rng: random.Random,
    now: datetime,
    n_bad: int,
    large: int,
) -> list[RawRecord]:
    records: list[RawRecord] = []
    for _ in range(large):
        draft = source.draft("json")
        assert isinstance(draft, JsonDraft)
        records.append(faults.oversize(draft))
    # Round robin over the (format, reason) pairs, reshuffled per round, so
    # even a small run sees a spread of reasons.
    pairs = [(f, r) for f in formats for r in faults.REASONS[kind][f]]
    cycle: list[tuple[Format, str]] = []
    for _ in range(n_bad - large):
        if not cycle:
            cycle = rng.sample(pairs, len(pairs))
        fmt, reason = cycle.pop()
        # Structured: a protobuf log-line body has no event_time to corrupt.
        draft = source.draft(fmt, structured=True)
        records.append(faults.corrupt(reason, draft, kind, rng, now))
    return records


def _with_duplicates(originals: list[RawRecord], n_dup: int, rng: random.Random) -> list[RawRecord]:
    """Insert re-sends of good records, each somewhere after its original."""
    positions = [i for i, record in enumerate(originals) if record.expected == "clean"]
    # Sort keys: originals at their index, a duplicate at a point in
    # (index of its original, end], so it always follows the original.
    keyed: list[tuple[float, int, RawRecord]] = [
        (float(i), 0, record) for i, record in enumerate(originals)
    ]
    for n in range(n_dup):
        i = rng.choice(positions)
        original = originals[i]
        place = i + (1.0 - rng.random()) * (len(originals) - i)
        copy = RawRecord(
            original.key, original.value, original.headers, "duplicate", "", original.event_id
        )
        keyed.append((place, n + 1, copy))
    keyed.sort(key=lambda item: (item[0], item[1]))
    return [record for _, _, record in keyed]
