"""The compiled path for the common JSON sensor reading: what it accepts is the
Python path's clean record (the same event, key and id), and whatever else it
leaves to the Python path (it never rejects)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.ingest_peers import Forgetful
from bench.services import sensor_event
from shared.contracts.aistack.v1 import events_pb2
from svc_ingest import fields, payload, sensor_bytes
from svc_ingest.cleaner import Cleaner
from svc_ingest.handlers import RecordHandler
from svc_ingest.rules import CleaningRules
from svc_ingest.sensor_bytes_build import SOURCE as SOURCE_C
from tests.unit.test_ingest_properties import sensor_docs

RULES = CleaningRules(metric_ranges={"temperature": (-90.0, 60.0)})
NOW_US = 2_000_000_000 * 10**6
SOURCE = "aistack.events.raw"
JSON = [("content-type", b"application/json")]
TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-01$")


def test_make_setup_built_the_compiled_path() -> None:
    # make setup builds it or stops; without it the worker runs at about half its rate.
    assert sensor_bytes.BUILT, "svc_ingest._sensor_bytes is not built: run make setup"


def handlers(rules: CleaningRules = RULES) -> tuple[RecordHandler, RecordHandler]:
    """(with the compiled path, Python alone), under the same rules."""
    made = [
        RecordHandler(
            Cleaner(rules), Forgetful(), source_topic=SOURCE, clean_topic="c", dlq_topic="d"
        )
        for _ in range(2)
    ]
    made[1]._compiled = None
    return made[0], made[1]


def compare(value: bytes, rules: CleaningRules = RULES, *, partition: int = 3) -> bool:
    """Whether the compiled path took ``value``; asserts it agrees with Python."""
    compiled, python = handlers(rules)
    assert compiled._compiled is not None
    found = compiled._compiled.clean(value, NOW_US, partition, 17)
    mine = compiled.handle(partition, 17, b"k", value, JSON, NOW_US)
    theirs = python.handle(partition, 17, b"k", value, JSON, NOW_US)
    if found is None:
        return False
    assert theirs.kind == "clean", (theirs.reason, theirs.message)
    assert not theirs.more
    assert (mine.kind, mine.topic, mine.key, mine.event_id) == (
        theirs.kind,
        theirs.topic,
        theirs.key,
        theirs.event_id,
    )
    assert mine.value is not None and theirs.value is not None
    ours, expected = events_pb2.CleanEvent(), events_pb2.CleanEvent()
    ours.ParseFromString(mine.value)
    expected.ParseFromString(theirs.value)
    assert ours == expected
    assert [k for k, _ in mine.headers] == [k for k, _ in theirs.headers]
    return True


def dumps(doc: Any, style: int) -> bytes:
    if style == 0:
        return json.dumps(doc, separators=(",", ":")).encode()
    if style == 1:
        return json.dumps(doc).encode()
    return json.dumps(doc, indent=1, ensure_ascii=False).encode()


@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
@given(doc=sensor_docs, style=st.integers(0, 2))
def test_what_the_compiled_path_accepts_is_the_python_paths_record(doc: Any, style: int) -> None:
    compare(dumps(doc, style))


READING: dict[str, Any] = {
    "event_id": "E-1",
    "device_id": " Thermo-1 ",
    "timestamp": 1_795_251_600.5,
    "metrics": {
        "temperature": {"value": 71.6, "unit": "F"},
        "humidity": {"value": 40, "unit": "%"},
        "pressure": {"value": 1013, "unit": "hPa"},
        "rpm": 1200,
    },
    "site": "plant-a",
}

numbers = (
    st.integers(-(10**18) + 1, 10**18 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.floats(0, 2e11)
    | st.integers(0, 10**17)
)
scalars = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.text(max_size=6)


@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
@given(
    when=numbers,
    temperature=numbers,
    unit=st.sampled_from(["C", "F", "K", "°C", None, "", "zz", 5]),
    event_id=st.none() | st.integers() | st.text(max_size=5) | st.just(""),
    device=st.integers() | st.text(max_size=5) | st.sampled_from(["A B", " X ", "dev-1"]),
    extra=scalars,
    attributes=st.none() | st.dictionaries(st.text(max_size=4), scalars, max_size=3),
    style=st.integers(0, 2),
)
def test_readings_near_the_common_shape_agree(
    when: Any,
    temperature: Any,
    unit: Any,
    event_id: Any,
    device: Any,
    extra: Any,
    attributes: Any,
    style: int,
) -> None:
    doc = {
        **({} if event_id == "" else {"event_id": event_id}),
        "device_id": device,
        "timestamp": when,
        "metrics": {"temperature": {"value": temperature, "unit": unit}, "rpm": 40},
        "attributes": attributes,
        "rssi": extra,
    }
    compare(dumps(doc, style))


@pytest.mark.parametrize(
    "value",
    [
        dumps(READING, 0),
        dumps(READING, 1),
        dumps(READING, 2),
        # no producer's id: the content hash
        dumps({k: v for k, v in READING.items() if k != "event_id"}, 0),
        dumps({**READING, "event_id": None}, 0),
        dumps({**READING, "event_id": 42, "device_id": 7}, 0),
        # an epoch in ms, µs and ns, as integers and as numbers with a fraction
        dumps({**READING, "timestamp": 1_795_251_600_123}, 0),
        dumps({**READING, "timestamp": 1_795_251_600_123_456}, 0),
        dumps({**READING, "timestamp": 1.7952516001234567e18}, 0),
        dumps({**READING, "ts": 1_795_251_600, "timestamp": 1_795_251_601}, 0),
        # attributes of every scalar kind, and one an extra key overwrites
        dumps({**READING, "attributes": {"a": "x", "b": 1, "c": True, "d": None, "site": "o"}}, 0),
        dumps({**READING, "metrics": {"rpm": {"value": 20, "unit": None}}}, 0),
        dumps({**READING, "metrics": {"rpm": 2e1, "load": {"value": -3}}}, 0),
        sensor_event(0, 1_795_251_600.0),
    ],
)
def test_the_common_shapes_take_the_compiled_path(value: bytes) -> None:
    assert compare(value), value


@pytest.mark.parametrize(
    "value",
    [
        dumps({**READING, "site": "Zürich"}, 2),  # not ASCII
        dumps({**READING, "site": 'say "hi"'}, 0),  # an escape
        dumps({**READING, "site": 1.5}, 0),  # a float attribute: its text is repr's
        dumps({**READING, "site": [1]}, 0),
        dumps({**READING, "timestamp": "2026-11-21T08:00:00Z"}, 0),
        dumps({**READING, "type": "sensor"}, 0),
        dumps({**READING, "metrics": {"temperature": 999}}, 0),
        dumps({**READING, "metrics": {"temperature": 1, "Temperature": 2}}, 0),
        dumps({**READING, "metrics": {}}, 0),
        dumps({**READING, "device_id": ""}, 0),
        dumps({**READING, "timestamp": 4e12 * 1000}, 0),  # ahead of the clock
        b'{"device_id":"a","device_id":"b","timestamp":1,"metrics":{"x":1}}',
        b'{"device_id":"a","timestamp":1,"metrics":{"x":-0}}',
        b' {"device_id":"a","timestamp":1,"metrics":{"x":1}}',
        b'{"device_id":"a","timestamp":1,"metrics":{"x":1}} x',
        b'{"device_id":"a","timestamp":1,"metrics":{"x":1e999}}',
        b'{"device_id":"a","timestamp":1,"metrics":{"x":01}}',
        b'{"device_id":"a","timestamp":1,"metrics":{"x":{"v":{"deep":1}}}}',
    ],
)
def test_what_is_not_plainly_the_common_shape_is_left_to_python(value: bytes) -> None:
    assert not compare(value)


def test_rules_bind_the_compiled_path_as_they_bind_python() -> None:
    value = dumps(READING, 0)
    assert compare(value)
    for rules in (
        CleaningRules(max_payload_bytes=len(value) - 1),
        CleaningRules(max_nesting_depth=2),
        CleaningRules(max_id_length=3),
        CleaningRules(max_metrics=2),
    ):
        assert not compare(value, rules, partition=0)
    assert sensor_bytes.compiled(Cleaner(CleaningRules(max_events=0)), SOURCE) is None


def test_the_field_lists_are_those_of_svc_ingest_fields() -> None:
    # _sensor_bytes.c spells out fields' preference lists: a key added to
    # one and not the other would be read differently.
    text = SOURCE_C.read_text(encoding="utf-8")
    for names, c_name in (
        (fields.EVENT_ID, "EVENT_ID"),
        (fields.TIME, "TIME"),
        (fields.DEVICE, "DEVICE"),
        (fields.KIND, "KIND"),
    ):
        spelled = text.split(f"static const char *const {c_name}[] = {{", 1)[1].split("}", 1)[0]
        assert [part.strip().strip('"') for part in spelled.split(",")][:-1] == [*names], c_name


def test_every_cut_of_a_reading_is_declined_or_agrees() -> None:
    # A parser written by hand: a record cut short anywhere, or with one
    # byte changed anywhere, must neither crash nor be read as something else.
    value = dumps({**READING, "attributes": {"a": "x", "b": 1}}, 1)
    for end in range(len(value)):
        compare(value[:end])
    for at in range(len(value)):
        for byte in (b"{", b"}", b'"', b",", b":", b"\\", b"\x00", b"\xff", b"9", b"-", b"e"):
            compare(value[:at] + byte + value[at + 1 :])


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_any_bytes_are_declined_or_agree(value: bytes) -> None:
    compare(b"{" + value)


@pytest.mark.parametrize(
    ("content_type", "compiled"),
    [
        ("", True),
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/cloudevents+json", True),
        ("application/senml+json", False),  # a SenML pack is an array: rejected
        ("text/plain", False),
        ("application/x-protobuf", False),
    ],
)
def test_only_what_decode_reads_as_json_takes_the_compiled_path(
    content_type: str, compiled: bool
) -> None:
    value = dumps(READING, 0)
    handler, python = handlers()
    found = handler.handle(0, 1, b"k", value, [("content-type", content_type.encode())], NOW_US)
    expected = python.handle(0, 1, b"k", value, [("content-type", content_type.encode())], NOW_US)
    assert (found.kind, found.reason, found.key) == (expected.kind, expected.reason, expected.key)
    assert (found.kind == "clean") is compiled
    assert payload.reads_as_json_object(content_type) is compiled


def test_a_fresh_traceparent_is_w3c_and_new_each_time() -> None:
    drawn = [sensor_bytes.fresh_traceparent() for _ in range(10_000)]
    assert all(TRACEPARENT.match(value.decode()) for value in drawn)
    assert len(set(drawn)) == len(drawn)
    # Trace and span ids alike: neither half repeats another draw's.
    assert len({value[3:35] for value in drawn}) == len(drawn)
    assert len({value[36:52] for value in drawn}) == len(drawn)


def test_a_forked_child_draws_other_traces_than_its_parent() -> None:
    # Without the reseed at fork, a child's generator starts where its
    # parent's stood, and the two draw the same traces.
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.write(writing, b"".join(sensor_bytes.fresh_traceparent() for _ in range(3)))
        os._exit(0)
    os.close(writing)
    _, status = os.waitpid(child, 0)
    theirs = os.read(reading, 3 * 55)
    os.close(reading)
    assert os.waitstatus_to_exitcode(status) == 0 and len(theirs) == 3 * 55
    mine = b"".join(sensor_bytes.fresh_traceparent() for _ in range(3))
    assert mine != theirs


def test_a_clean_record_carries_a_fresh_trace_or_its_readings_continued() -> None:
    compiled, _ = handlers()
    reading = sensor_event(7, NOW_US / 1e6)
    fresh = compiled.handle(0, 1, b"k", reading, JSON, NOW_US)
    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    traced = compiled.handle(
        0, 2, b"k", sensor_event(8, NOW_US / 1e6), [*JSON, ("traceparent", parent.encode())], NOW_US
    )
    fresh_trace = dict(fresh.headers)["traceparent"].decode()
    traced_trace = dict(traced.headers)["traceparent"].decode()
    assert TRACEPARENT.match(fresh_trace) and fresh_trace.split("-")[1] != "a" * 32
    assert TRACEPARENT.match(traced_trace)
    assert traced_trace.split("-")[1] == "a" * 32 and traced_trace.split("-")[2] != "b" * 16
