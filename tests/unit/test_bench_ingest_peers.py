"""bench.ingest_peers' pure parts, without a broker: the peers publish what
svc_ingest publishes (dedup aside), and their rate is measured one way."""

from __future__ import annotations

import time

import pytest

from bench.ingest_peers import RateClock, RecordOutputs, read_rate
from loadgen.plan import generate
from shared.contracts.aistack.v1 import events_pb2
from svc_ingest.cleaner import Cleaner
from svc_ingest.dedup import DedupWindow
from svc_ingest.handlers import RecordHandler
from svc_ingest.settings import IngestSettings

SETTINGS = IngestSettings(source_topic="raw", clean_topic="clean", dlq_topic="dlq")


def test_outputs_are_svc_ingests_records_for_fresh_events() -> None:
    outputs = RecordOutputs(SETTINGS)
    handler = RecordHandler(
        Cleaner(SETTINGS.cleaning_rules()),
        DedupWindow({}, window_ms=60_000),
        source_topic="raw",
        clean_topic="clean",
        dlq_topic="dlq",
    )
    now_us = time.time_ns() // 1000
    records = generate("sensors", 200, bad_fraction=0.1, seed=7)
    kinds = set()
    for offset, r in enumerate(records):
        headers = list(r.headers)
        ours = outputs(2, offset, r.key, r.value, headers, now_us)
        theirs = handler.handle(2, offset, r.key, r.value, headers, now_us)
        kinds.add(theirs.kind)
        expected = [(theirs.key, theirs.value, theirs.headers), *theirs.more]
        assert [out.topic for out in ours] == [theirs.topic] * len(expected)
        assert [out.key for out in ours] == [key for key, _, _ in expected]
        assert [[name for name, _ in out.headers] for out in ours] == [
            [name for name, _ in headers] for _, _, headers in expected
        ]
        if theirs.kind == "clean":
            assert [out.value for out in ours] == [value for _, value, _ in expected]
        else:
            # Its rejection time and service are its own; the rest is the same.
            letter = events_pb2.DeadLetter.FromString(ours[0].value)
            original = events_pb2.DeadLetter.FromString(theirs.value or b"")
            assert (letter.reason, letter.original_value, letter.source) == (
                original.reason,
                original.original_value,
                original.source,
            )
            assert dict(ours[0].headers)["error"] == theirs.reason.encode()
    assert kinds == {"clean", "dead_letter"}


def test_rate_runs_from_first_record_to_count_th() -> None:
    now = iter([10.0, 12.0, 14.0])
    clock = RateClock(100, clock=lambda: next(now))
    clock.start()
    clock.start()  # only the first record starts the clock
    assert clock.handled(60) is None
    assert clock.handled(40) == 100 / 2.0
    assert clock.handled(10) is None  # once only
    assert clock.rate == 50.0


def test_rate_needs_a_start() -> None:
    with pytest.raises(RuntimeError):
        RateClock(1).handled(1)


def test_read_rate_finds_the_last_rate_behind_terminal_escapes() -> None:
    assert read_rate("noise\nrate 12.5\n\x1b[?25hrate 6240.5\n") == 6240.5
    assert read_rate("no rate here\n") is None


def test_outputs_keep_no_dedup_a_repeat_is_published_again() -> None:
    outputs = RecordOutputs(SETTINGS)
    record = generate("sensors", 1, bad_fraction=0.0, seed=3)[0]
    now_us = time.time_ns() // 1000
    first = outputs(0, 0, record.key, record.value, list(record.headers), now_us)
    again = outputs(0, 1, record.key, record.value, list(record.headers), now_us)
    assert [out.topic for out in first] == [out.topic for out in again] == ["clean"]
