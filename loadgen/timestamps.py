"""Event times in the shapes real producers write them."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
# Offsets devices and servers are configured with, in minutes (India's +05:30 included).
_OFFSETS = (0, 0, 60, 120, -300, 330, -480, 540)
# ISO twice: the commonest shape; the epoch forms differ only in magnitude.
_STYLES = ("iso", "iso", "epoch_s", "epoch_s_float", "epoch_ms", "epoch_us")

Stamp = str | int | float


#: How far back event times go by default: an hour.
DEFAULT_SPAN_SECONDS = 3600.0


def recent(
    rng: random.Random, now: datetime, span_seconds: float = DEFAULT_SPAN_SECONDS
) -> datetime:
    """A moment in the ``span_seconds`` before ``now`` (at least a second before it)."""
    return now - timedelta(seconds=rng.uniform(1.0, max(1.0, span_seconds)))


def future(rng: random.Random, now: datetime) -> datetime:
    """About a day ahead: far past any clock-skew allowance."""
    return now + timedelta(days=1, seconds=rng.uniform(0.0, 7200.0))


def offset(rng: random.Random) -> int:
    return rng.choice(_OFFSETS)


def iso(moment: datetime, offset_minutes: int, *, zulu: bool = False) -> str:
    """``2026-11-21T10:00:00.123+01:00``; ``…Z`` for UTC when ``zulu``."""
    local = moment.astimezone(timezone(timedelta(minutes=offset_minutes)))
    text = local.isoformat(timespec="milliseconds")
    return text[:-6] + "Z" if zulu and offset_minutes == 0 else text


def epoch_us(moment: datetime) -> int:
    # Integer arithmetic: float seconds lose the last microsecond digits.
    return (moment - _EPOCH) // timedelta(microseconds=1)


def render(rng: random.Random, moment: datetime) -> Stamp:
    """``moment`` in a randomly chosen producer style (ISO or epoch s/ms/µs)."""
    style = rng.choice(_STYLES)
    micros = epoch_us(moment)
    if style == "epoch_s":
        return micros // 1_000_000
    if style == "epoch_s_float":
        return round(micros / 1_000_000, 3)
    if style == "epoch_ms":
        return micros // 1000
    if style == "epoch_us":
        return micros
    return iso(moment, offset(rng), zulu=rng.random() < 0.3)


def like(example: object, moment: datetime) -> Stamp:
    """``moment`` in the same style as ``example``, so a corrupted time looks native."""
    micros = epoch_us(moment)
    if isinstance(example, float):
        return round(micros / 1_000_000, 3)
    if isinstance(example, int) and not isinstance(example, bool):
        # The magnitude tells epoch seconds, milliseconds and microseconds apart.
        if example < 10**11:
            return micros // 1_000_000
        if example < 10**14:
            return micros // 1000
        return micros
    if isinstance(example, str):
        try:
            parsed = datetime.fromisoformat(example)
        except ValueError:
            parsed = None
        delta = parsed.utcoffset() if parsed is not None else None
        if delta is not None:
            return iso(moment, int(delta.total_seconds() // 60), zulu=example.endswith("Z"))
    return iso(moment, 0)


def clf(moment: datetime, offset_minutes: int) -> str:
    """``21/Nov/2026:10:00:00 +0100``; English month names whatever the locale."""
    local = moment.astimezone(timezone(timedelta(minutes=offset_minutes)))
    sign = "-" if offset_minutes < 0 else "+"
    hours, minutes = divmod(abs(offset_minutes), 60)
    return (
        f"{local.day:02d}/{_MONTHS[local.month - 1]}/{local.year:04d}:"
        f"{local.hour:02d}:{local.minute:02d}:{local.second:02d} {sign}{hours:02d}{minutes:02d}"
    )
