"""The load generator: exact counts, determinism, and the promised defects."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest

from aistack.cli import main
from loadgen import faults
from loadgen.plan import generate
from loadgen.publish import send
from loadgen.records import RawRecord
from shared.contracts.aistack.v1 import events_pb2
from shared.errors import InvalidArgument

KINDS: tuple[Literal["sensors", "weblogs"], ...] = ("sensors", "weblogs")
NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
CLF = re.compile(
    r"\S+ \S+ \S+ \[\d{2}/[A-Z][a-z]{2}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4}\] "
    r'"[A-Z]+ \S+ HTTP/\d\.\d" \d{3} (?:\d+|-) "[^"]*" "[^"]*"(?: \d+\.\d+)?'
)
SENSOR_UNITS = {
    "temperature": {"C", "°C", "F", "°F", "K"},
    "humidity": {"%"},
    "pressure": {"hPa", "Pa", "kPa", "psi"},
    "battery": {"V", "mV"},
    "co2": {"ppm"},
    "speed": {"m/s", "km/h"},
}


def content_type(record: RawRecord) -> str:
    return dict(record.headers).get("content-type", b"").decode()


def strict_json(value: bytes) -> Any:
    """json.loads that also refuses NaN/Infinity and repeated keys."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        assert len({k for k, _ in items}) == len(items), "duplicate key"
        return dict(items)

    def constant(name: str) -> Any:
        raise ValueError(name)

    return json.loads(value, object_pairs_hook=pairs, parse_constant=constant)


def depth(node: Any) -> int:
    if isinstance(node, dict):
        return 1 + max((depth(v) for v in node.values()), default=0)
    if isinstance(node, list):
        return 1 + max((depth(v) for v in node), default=0)
    return 0


def event_seconds(stamp: Any) -> float:
    if isinstance(stamp, str):
        return datetime.fromisoformat(stamp).timestamp()
    size = abs(stamp)
    return float(stamp) / (1 if size < 1e11 else 1e3 if size < 1e14 else 1e6)


def metrics_of(doc: dict[str, Any]) -> list[tuple[str, Any, str]]:
    metrics = doc["metrics"]
    if isinstance(metrics, dict):
        return [(name, m["value"], m["unit"]) for name, m in metrics.items()]
    return [(m["name"], m["value"], m["unit"]) for m in metrics]


def to_celsius(value: float, unit: str) -> float:
    if unit in ("F", "°F"):
        return (value - 32) * 5 / 9
    return value - 273.15 if unit == "K" else value


def to_hpa(value: float, unit: str) -> float:
    return {"hPa": 1.0, "Pa": 0.01, "kPa": 10.0, "psi": 68.947572932}[unit] * value


# Counts, determinism, order ---------------------------------------------------


@pytest.mark.parametrize("kind", ["sensors", "weblogs"])
@pytest.mark.parametrize(("count", "bad", "dup"), [(0, 0.0, 0.0), (7, 0.3, 0.3), (1000, 0.25, 0.1)])
def test_counts_per_outcome_are_exact(kind: Any, count: int, bad: float, dup: float) -> None:
    records = generate(kind, count, bad_fraction=bad, duplicate_fraction=dup, seed=1, now=NOW)
    outcomes = Counter(r.expected for r in records)
    assert len(records) == count
    assert outcomes["dead_letter"] == round(count * bad)
    assert outcomes["duplicate"] == round(count * dup)
    assert outcomes["clean"] == count - round(count * bad) - round(count * dup)


@pytest.mark.parametrize("kind", ["sensors", "weblogs"])
def test_same_seed_same_records_other_seed_others(kind: Any) -> None:
    def run(seed: int) -> list[RawRecord]:
        return generate(kind, 300, bad_fraction=0.2, duplicate_fraction=0.1, seed=seed, now=NOW)

    assert run(5) == run(5)
    assert run(5) != run(6)


@pytest.mark.parametrize("kind", ["sensors", "weblogs"])
def test_duplicates_repeat_an_earlier_good_record_exactly(kind: Any) -> None:
    records = generate(kind, 500, bad_fraction=0.1, duplicate_fraction=0.2, seed=2, now=NOW)
    for i, record in enumerate(records):
        if record.expected != "duplicate":
            continue
        earlier = [
            r
            for r in records[:i]
            if r.expected == "clean"
            and (r.key, r.value, r.headers, r.event_id)
            == (record.key, record.value, record.headers, record.event_id)
        ]
        assert len(earlier) == 1, f"duplicate at {i} has no single earlier original"


@pytest.mark.parametrize("kind", ["sensors", "weblogs"])
def test_good_records_are_unique(kind: Any) -> None:
    records = generate(kind, 2000, fmt="mixed", seed=3, now=NOW)
    ids = [r.event_id for r in records if r.event_id]
    assert len(ids) == len(set(ids))
    # Log lines have no id: svc_ingest dedups them by content.
    assert len({r.value for r in records}) == len(records)
    for record in records:
        value = record.value or b""
        # JSON and protobuf carry an id; only log lines (bare ones included) have none.
        if value.startswith((b"{", b"\n")):
            assert record.event_id
        else:
            assert CLF.fullmatch(value.decode()) and not record.event_id


def test_mixed_format_leaves_some_records_without_content_type() -> None:
    records = generate("weblogs", 1000, seed=4, now=NOW)
    bare = sum(1 for r in records if not r.headers)
    assert 120 <= bare <= 280  # ~20 %
    assert {content_type(r) for r in records} == {
        "",
        "application/json",
        "application/x-protobuf",
        "text/plain",
    }


def test_too_large_is_rare_and_can_be_turned_off() -> None:
    def large(count: int, **kw: Any) -> int:
        records = generate("sensors", count, bad_fraction=0.2, seed=5, now=NOW, **kw)
        return sum(r.reason == "too_large" for r in records)

    assert large(999) == 0
    assert large(2000) == 2
    assert large(2000, allow_large=False) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"count": -1}, "count"),
        ({"bad_fraction": 1.5}, "bad fraction"),
        ({"duplicate_fraction": math.nan}, "duplicate fraction"),
        ({"bad_fraction": 0.6, "duplicate_fraction": 0.6}, "exceed"),
        ({"bad_fraction": 0.5, "duplicate_fraction": 0.5}, "at least one good"),
        ({"fmt": "xml"}, "format"),
        ({"kind": "sensors", "fmt": "log"}, "log"),
        ({"now": datetime(2026, 1, 1)}, "timezone"),
        ({"span_seconds": 0.5}, "span"),
        ({"span_seconds": math.inf}, "span"),
        ({"shift": {"temperature": 5.0}}, "sensor readings only"),
    ],
)
def test_impossible_arguments_raise(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"kind": "weblogs", "count": 10, **kwargs}
    with pytest.raises(InvalidArgument, match=message):
        generate(args.pop("kind"), args.pop("count"), **args)


# Good records ---------------------------------------------------------------------


def test_good_sensor_json_has_the_documented_fields() -> None:
    records = generate("sensors", 600, fmt="json", seed=6, now=NOW)
    shapes: set[str] = set()
    for record in records:
        doc = strict_json(record.value or b"")
        assert content_type(record) == "application/json"
        assert record.key == doc["device_id"].encode()
        assert doc["event_id"] == record.event_id
        assert doc["attributes"]["site"]
        assert NOW.timestamp() - 3601 <= event_seconds(doc["timestamp"]) < NOW.timestamp()
        shapes.add(type(doc["timestamp"]).__name__ + type(doc["metrics"]).__name__)
        for name, value, unit in metrics_of(doc):
            assert unit in SENSOR_UNITS[name]
            number = float(value)
            if name == "temperature":
                assert -40 <= to_celsius(number, unit) <= 60
            elif name == "humidity":
                assert 0 <= number <= 100
            elif name == "pressure":
                assert 950 <= to_hpa(number, unit) <= 1050
    # Every timestamp type with both metric shapes.
    assert shapes == {f"{t}{m}" for t in ("str", "int", "float") for m in ("dict", "list")}


def test_span_and_shift_move_times_and_readings() -> None:
    def celsius(records: list[RawRecord]) -> list[float]:
        return [
            to_celsius(float(value), unit)
            for record in records
            for name, value, unit in metrics_of(strict_json(record.value or b""))
            if name == "temperature"
        ]

    plain = generate("sensors", 800, fmt="json", seed=9, now=NOW, span_seconds=300)
    shifted = generate(
        "sensors", 800, fmt="json", seed=9, now=NOW, span_seconds=300, shift={"temperature": 15.0}
    )
    for record in plain:
        assert NOW.timestamp() - 301 <= event_seconds(strict_json(record.value or b"")["timestamp"])
    before, after = celsius(plain), celsius(shifted)
    assert len(before) == len(after) > 100
    # The same draws, moved by the shift (rounding to the device's unit aside).
    differences = [b - a for a, b in zip(before, after, strict=True)]
    assert all(abs(d - 15.0) < 0.05 for d in differences)


def test_good_web_json_has_the_documented_fields() -> None:
    for record in generate("weblogs", 400, fmt="json", seed=7, now=NOW):
        doc = strict_json(record.value or b"")
        assert record.key == doc["host"].encode()
        assert doc["event_id"] == record.event_id
        assert {"remote_addr", "time", "status", "bytes", "user_agent", "referer"} <= doc.keys()
        assert NOW.timestamp() - 3601 <= event_seconds(doc["time"]) < NOW.timestamp()
        assert "request" in doc or {"method", "path", "protocol"} <= doc.keys()
        assert ("request_time" in doc) != ("latency_ms" in doc)
        assert 100 <= doc["status"] <= 599


@pytest.mark.parametrize("kind", ["sensors", "weblogs"])
def test_good_protobuf_parses_as_raw_event(kind: Any) -> None:
    bodies = set()
    for record in generate(kind, 300, fmt="protobuf", seed=8, now=NOW):
        event = events_pb2.RawEvent.FromString(record.value or b"")
        assert event.event_id == record.event_id
        body = event.WhichOneof("body")
        bodies.add(body)
        if body == "log_line":
            assert CLF.fullmatch(event.log_line)
            continue
        assert NOW - timedelta(hours=1) <= event.event_time.ToDatetime(UTC) < NOW
        if body == "sensor_reading":
            assert record.key == event.sensor_reading.device_id.encode()
            for m in event.sensor_reading.measurements:
                assert m.unit in SENSOR_UNITS[m.metric]
        else:
            assert record.key == event.web_request.host.encode()
            assert event.web_request.status and event.web_request.method
    assert bodies == ({"sensor_reading"} if kind == "sensors" else {"web_request", "log_line"})


def test_good_log_lines_are_combined_log_format() -> None:
    with_time = 0
    for record in generate("weblogs", 300, fmt="log", seed=9, now=NOW):
        line = (record.value or b"").decode()
        assert content_type(record) == "text/plain"
        assert CLF.fullmatch(line), line
        assert record.event_id == ""
        with_time += bool(re.search(r'" \d+\.\d{3}$', line))
    assert 0 < with_time < 300


# Bad records ----------------------------------------------------------------------


def bad_records() -> list[RawRecord]:
    return [
        r
        for kind in KINDS
        for r in generate(kind, 3000, bad_fraction=0.5, seed=10, now=NOW)
        if r.expected == "dead_letter"
    ]


BAD = bad_records()


def test_every_reason_appears() -> None:
    assert {r.reason for r in BAD} == faults.ALL_REASONS


def test_bad_records_always_say_their_content_type() -> None:
    assert all(content_type(r) for r in BAD)


@pytest.mark.parametrize("reason", sorted(faults.ALL_REASONS))
def test_each_bad_record_has_its_defect(reason: str) -> None:
    records = [r for r in BAD if r.reason == reason]
    assert records
    for record in records:
        check_defect(record)


def check_defect(record: RawRecord) -> None:
    value, reason, kind = record.value, record.reason, content_type(record)
    if reason == "null_value":
        assert value is None
        return
    assert value is not None
    if reason == "empty":
        assert value == b""
    elif reason == "too_large":
        assert len(value) > 2 * 1024 * 1024
        assert isinstance(strict_json(value), dict)
    elif reason == "invalid_utf8":
        with pytest.raises(UnicodeDecodeError):
            value.decode("utf-8")
    elif reason == "byte_order_mark":
        assert value.startswith(b"\xef\xbb\xbf")
        assert isinstance(strict_json(value[3:]), dict)
    elif reason == "invalid_json":
        value.decode("utf-8")
        with pytest.raises(ValueError):
            json.loads(value)
    elif reason == "duplicate_key":
        with pytest.raises(AssertionError, match="duplicate key"):
            strict_json(value)
    elif reason == "not_an_object":
        assert not isinstance(strict_json(value), dict)
    elif reason == "too_deep":
        assert depth(strict_json(value)) > 32
    elif reason == "non_finite":
        if kind == "application/json":
            assert re.search(rb":-?(NaN|Infinity)[,}]", value)
        else:
            event = events_pb2.RawEvent.FromString(value)
            numbers = [m.value for m in event.sensor_reading.measurements]
            assert not all(map(math.isfinite, [*numbers, event.web_request.latency_ms]))
    elif reason == "invalid_protobuf":
        assert kind == "application/x-protobuf"
        assert faults.is_invalid_protobuf(value)
    elif reason == "malformed_log_line":
        assert kind == "text/plain"
        assert not CLF.fullmatch(value.decode("utf-8"))
    else:
        check_field_defect(record, value, reason, kind)


def check_field_defect(record: RawRecord, value: bytes, reason: str, kind: str) -> None:
    if kind == "application/x-protobuf":
        event = events_pb2.RawEvent.FromString(value)
        reading = event.sensor_reading
        if reason == "missing_field":
            assert not event.HasField("event_time") or not reading.device_id
        elif reason == "future_timestamp":
            assert event.event_time.ToDatetime(UTC) > NOW + timedelta(hours=23)
        elif reason == "unknown_unit":
            assert reading.measurements[0].unit in faults.UNKNOWN_UNITS
        elif reason == "out_of_range":
            assert {(m.metric, m.value) for m in reading.measurements} & {
                ("temperature", 900.0),
                ("humidity", 150.0),
            }
        else:
            pytest.fail(f"unexpected protobuf reason {reason}")
        return
    doc = strict_json(value)
    sensor = "device_id" in doc or "metrics" in doc
    time_field = "timestamp" if sensor else "time"
    if reason == "missing_field":
        required = {"device_id", "timestamp"} if sensor else {"time", "status"}
        assert not required <= doc.keys()
    elif reason == "invalid_timestamp":
        with pytest.raises(ValueError):
            datetime.fromisoformat(doc[time_field])
    elif reason == "future_timestamp":
        assert event_seconds(doc[time_field]) > (NOW + timedelta(hours=23)).timestamp()
    elif reason == "unknown_unit":
        assert any(u in faults.UNKNOWN_UNITS for _, _, u in metrics_of(doc))
    elif reason == "out_of_range":
        assert {(n, v, u) for n, v, u in metrics_of(doc)} & {
            ("temperature", 900.0, "°C"),
            ("humidity", 150.0, "%"),
        }
    elif reason == "invalid_type":
        values = [v for _, v, _ in metrics_of(doc)] if sensor else [doc["status"]]
        assert {"a": 1} in values or "abc" in values
    else:
        pytest.fail(f"unexpected JSON reason {reason}")


# Publishing and the command line ------------------------------------------------


class FakeSink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | str | None, list[tuple[str, bytes]]]] = []
        self.flushed = False

    def publish_raw(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: str | bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self.sent.append((topic, value, key, headers or []))

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def flush(self, timeout: float = 30.0) -> None:
        self.flushed = True


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_send_paces_by_sleeping_and_counts_outcomes() -> None:
    records = generate("sensors", 50, bad_fraction=0.2, duplicate_fraction=0.1, seed=11, now=NOW)
    sink, clock = FakeSink(), FakeClock()
    summary = send(records, sink, "t", rate=10.0, clock=clock, sleep=clock.sleep)
    assert [s[1] for s in sink.sent] == [r.value for r in records]
    assert sink.flushed
    assert (summary.good, summary.bad, summary.duplicate) == (35, 10, 5)
    assert summary.elapsed_s == pytest.approx(4.9)  # the 50th record is due at 49/10 s
    assert len(clock.sleeps) == 49
    line = summary.line(seed=11)
    assert "good 35, bad 10, duplicate 5" in line and "4.900s" in line and "\n" not in line


def test_send_without_rate_never_sleeps() -> None:
    clock = FakeClock()
    send(
        generate("weblogs", 20, seed=12, now=NOW),
        FakeSink(),
        "t",
        rate=0,
        clock=clock,
        sleep=clock.sleep,
    )
    assert clock.sleeps == []


@pytest.mark.parametrize(
    "argv",
    [
        ["sensors", "--rate", "0", "--count", "-5"],
        ["sensors", "--rate", "0", "--count", "many"],
        ["sensors", "--rate", "-1", "--count", "5"],
        ["sensors", "--rate", "0"],
        ["sensors", "--count", "5"],
        ["toasters", "--rate", "0", "--count", "5"],
        ["sensors", "--rate", "0", "--count", "5", "--format", "log"],
        ["weblogs", "--rate", "0", "--count", "5", "--format", "xml"],
        ["weblogs", "--rate", "0", "--count", "5", "--bad-fraction", "2"],
        ["weblogs", "--rate", "0", "--count", "5", "--duplicate-fraction", "1"],
        ["weblogs", "--rate", "0", "--count", "5", "--seed", "x"],
        ["weblogs", "--rate", "0", "--count", "5", "--topic", "no spaces"],
    ],
)
def test_cli_bad_arguments_fail_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # No broker runs here: a bad argument must stop before any connection.
    assert main(["produce", *argv]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("aistack: produce: ") and err.count("\n") == 1
