"""``aistack produce``: paced publishing of generated records to Kafka."""

from __future__ import annotations

import math
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from loadgen.plan import FORMATS, generate
from loadgen.records import RawRecord
from shared.bus.topics import EVENTS_RAW
from shared.errors import InvalidArgument

# Room for the too_large records (2 MiB + JSON); the broker sees them lz4
# compressed, far below its own 1 MB batch limit.
_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
_POLL_EVERY = 1000
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


class Sink(Protocol):
    """The part of shared.bus.producer.BusProducer the loop needs."""

    def publish_raw(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: str | bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None: ...

    def poll(self, timeout: float = 0.0) -> int: ...

    def flush(self, timeout: float = 30.0) -> None: ...


@dataclass(frozen=True)
class Summary:
    topic: str
    good: int
    bad: int
    duplicate: int
    elapsed_s: float
    interrupted: bool = False

    def line(self, seed: int) -> str:
        sent = self.good + self.bad + self.duplicate
        rate = sent / self.elapsed_s if self.elapsed_s > 0 else 0.0
        stopped = " (interrupted)" if self.interrupted else ""
        return (
            f"sent {sent} records to {self.topic}{stopped}: good {self.good}, bad {self.bad}, "
            f"duplicate {self.duplicate} in {self.elapsed_s:.3f}s ({rate:.0f}/s), seed {seed}"
        )


def send(
    records: Sequence[RawRecord],
    sink: Sink,
    topic: str,
    *,
    rate: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Summary:
    """Publish ``records`` at ``rate`` per second (0: as fast as possible), then flush.

    Record i is due at start + i / rate; the loop sleeps until then, so a
    slow moment is caught up rather than lowering the average. Ctrl-C stops
    early: what was queued is still flushed. Raises Unavailable from flush.
    """
    counts = {"clean": 0, "dead_letter": 0, "duplicate": 0}
    start = clock()
    interrupted = False
    try:
        for i, record in enumerate(records):
            if rate > 0:
                delay = start + i / rate - clock()
                if delay > 0:
                    sleep(delay)
            sink.publish_raw(topic, record.value, key=record.key, headers=list(record.headers))
            counts[record.expected] += 1
            if i % _POLL_EVERY == 0:
                sink.poll(0)  # serve delivery reports so failures surface
    except KeyboardInterrupt:
        interrupted = True
    sink.flush()
    return Summary(
        topic,
        counts["clean"],
        counts["dead_letter"],
        counts["duplicate"],
        clock() - start,
        interrupted,
    )


@dataclass(frozen=True)
class Given:
    """``aistack produce``'s arguments as typed: strings, checked by ``options``."""

    kind: str
    rate: str | None
    count: str | None
    bad_fraction: str
    duplicate_fraction: str
    format: str
    seed: str | None
    topic: str | None


@dataclass(frozen=True)
class Options:
    kind: Literal["sensors", "weblogs"]
    count: int
    rate: float
    bad_fraction: float
    duplicate_fraction: float
    fmt: str
    seed: int
    topic: str


def options(args: Given) -> Options:
    """Checked options from the parsed command line; raises InvalidArgument.

    Values are checked here rather than by the command line's parser so that
    every bad value is one line, like every other aistack error.
    """
    if args.kind not in ("sensors", "weblogs"):
        raise InvalidArgument(f"produce: kind must be sensors or weblogs, got {args.kind!r}")
    kind = cast(Literal["sensors", "weblogs"], args.kind)
    if args.format not in FORMATS:
        raise InvalidArgument(
            f"produce: --format must be one of {', '.join(FORMATS)}, got {args.format!r}"
        )
    if kind == "sensors" and args.format == "log":
        raise InvalidArgument("produce: --format log is for weblogs only")
    topic = EVENTS_RAW if args.topic is None else args.topic
    if not _TOPIC_NAME.fullmatch(topic):
        raise InvalidArgument(f"produce: --topic {topic!r} is not a Kafka topic name")
    count = _int(args.count, "--count")
    if count < 0:
        raise InvalidArgument(f"produce: --count must be >= 0, got {count}")
    rate = _float(args.rate, "--rate")
    if not (math.isfinite(rate) and rate >= 0):
        raise InvalidArgument(f"produce: --rate must be >= 0 (0: as fast as possible), got {rate}")
    fractions = [
        _float(given, name)
        for given, name in (
            (args.bad_fraction, "--bad-fraction"),
            (args.duplicate_fraction, "--duplicate-fraction"),
        )
    ]
    # A seed is always known, so any run can be repeated from its summary line.
    seed = secrets.randbelow(2**31) if args.seed is None else _int(args.seed, "--seed")
    return Options(kind, count, rate, fractions[0], fractions[1], args.format, seed, topic)


def _int(given: str | None, name: str) -> int:
    try:
        return int(_given(given, name))
    except ValueError:
        raise InvalidArgument(f"produce: {name} must be an integer, got {given!r}") from None


def _float(given: str | None, name: str) -> float:
    try:
        return float(_given(given, name))
    except ValueError:
        raise InvalidArgument(f"produce: {name} must be a number, got {given!r}") from None


def _given(given: str | None, name: str) -> str:
    if given is None:
        raise InvalidArgument(f"produce: {name} is required")
    return given


def run(args: Given) -> int:
    """The ``aistack produce`` handler: generate, then publish; 130 if interrupted."""
    opts = options(args)
    # Generated before connecting: bad arguments never touch the broker.
    try:
        records = generate(
            opts.kind,
            opts.count,
            bad_fraction=opts.bad_fraction,
            duplicate_fraction=opts.duplicate_fraction,
            fmt=opts.fmt,
            seed=opts.seed,
        )
    except InvalidArgument as exc:
        raise InvalidArgument(f"produce: {exc}") from exc
    from shared.bus.producer import BusProducer
    from shared.settings import KafkaSettings, load_settings

    producer = BusProducer(
        load_settings(KafkaSettings),
        source="aistack-loadgen",
        config={"message.max.bytes": _MAX_MESSAGE_BYTES},
    )
    summary = send(records, producer, opts.topic, rate=opts.rate)
    print(summary.line(opts.seed))
    return 130 if summary.interrupted else 0
