"""No input crashes the cleaner, and every input yields exactly one outcome."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.bus import envelope
from shared.contracts.aistack.v1 import common_pb2, events_pb2
from svc_ingest.cleaner import Cleaner
from svc_ingest.dedup import DedupWindow
from svc_ingest.handlers import RawRecord, RecordHandler
from svc_ingest.rejection import REASONS, RecordRejected
from svc_ingest.rules import CleaningRules

NOW_US = 1_795_251_600 * 1_000_000
CONTENT_TYPES = st.sampled_from(
    [
        "",
        "application/json",
        "application/x-protobuf",
        "application/senml+json",
        "text/plain",
        "text/plain; charset=utf-8",
        "image/png",
    ]
)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
field_values = json_values | st.sampled_from(
    [
        "2026-11-21T08:00:00Z",
        "1795251000",
        "C",
        "°F",
        "%",
        "GET",
        "/x",
        "HTTP/1.1",
        "200",
        "-",
        "1e999",
        "nan",
    ]
)
sensor_docs = st.fixed_dictionaries(
    {},
    optional={
        "event_id": field_values,
        "device_id": field_values,
        "timestamp": field_values | st.integers(min_value=0, max_value=10**21),
        "metrics": st.dictionaries(
            st.sampled_from(["temperature", "humidity", "pressure", "x y", ""]),
            field_values | st.fixed_dictionaries({"value": field_values, "unit": field_values}),
            max_size=3,
        )
        | st.lists(
            st.fixed_dictionaries({"name": field_values, "value": field_values}), max_size=3
        ),
        "attributes": json_values,
        "extra": json_values,
    },
)
web_docs = st.fixed_dictionaries(
    {},
    optional={
        "host": field_values,
        "remote_addr": field_values,
        "time": field_values,
        "request": field_values,
        "method": field_values,
        "path": field_values,
        "status": field_values,
        "bytes": field_values,
        "request_time": field_values,
        "latency_ms": field_values,
        "user_agent": field_values,
    },
)


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


log_lines = st.builds(
    lambda client,
    t,
    req,
    status,
    size,
    tail: f'{client} - - [{t}] "{req}" {status} {size}{tail}'.encode(),
    st.sampled_from(["1.2.3.4", "::1", "host-a", "bad addr", "-"]),
    st.sampled_from(["21/Nov/2026:08:00:00 +0000", "99/Nov/2026:08:00:00 +0000", "x"]),
    st.text(max_size=30),
    st.integers(min_value=0, max_value=999),
    st.sampled_from(["0", "-", "123"]),
    st.sampled_from(["", ' "-" "-"', ' "r" "ua" 0.5', " 7"]),
)


def _protobuf(event: events_pb2.RawEvent) -> bytes:
    return event.SerializeToString()


raw_events = st.builds(
    lambda eid, device, metric, value, unit, seconds: _protobuf(
        events_pb2.RawEvent(
            event_id=eid,
            event_time={"seconds": seconds},
            sensor_reading=events_pb2.SensorReading(
                device_id=device,
                measurements=[events_pb2.Measurement(metric=metric, value=value, unit=unit)],
            ),
        )
    ),
    st.text(max_size=10),
    st.text(max_size=10),
    st.text(max_size=10),
    st.floats(),
    st.sampled_from(["", "C", "K", "V", "zz"]),
    st.integers(min_value=-(10**10), max_value=10**11),
)

VALID_SENSOR = {
    "event_id": "e-1",
    "device_id": "dev-1",
    "timestamp": "2026-11-21T08:00:00Z",
    "metrics": {"temperature": {"value": 20.5, "unit": "C"}, "humidity": "40"},
}
VALID_WEB = {
    "host": "web-1",
    "remote_addr": "10.0.0.1",
    "time": 1795251000,
    "request": "GET /a HTTP/1.1",
    "status": 200,
    "bytes": 10,
    "request_time": 0.01,
}


def _near(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """A valid document with up to two fields replaced, removed or added."""
    edits = st.dictionaries(
        st.sampled_from([*base, "extra"]), field_values | st.just(None), max_size=2
    )
    return edits.map(
        lambda changes: _json_bytes(
            {k: v for k, v in {**base, **changes}.items() if v is not None or k == "extra"}
        )
    )


senml_packs = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "bn": st.sampled_from(["dev-1:", "urn:dev:ow:1/", "", "bad name"]) | field_values,
            "bt": st.sampled_from([0, -5, 1_795_251_000, 2**28]) | field_values,
            "bu": st.sampled_from(["Cel", "%RH", "A"]) | field_values,
            "bv": field_values,
            "n": st.sampled_from(["temperature", "humidity", "x", "a:b"]) | field_values,
            "u": st.sampled_from(["Cel", "V", ""]) | field_values,
            "v": st.floats(allow_nan=False) | field_values,
            "vs": field_values,
            "vb": st.booleans() | field_values,
            "t": st.sampled_from([0, -1, 1_795_251_000.5, 10**20]) | field_values,
            "s": field_values,
            "x_": field_values,
        },
    ),
    max_size=4,
).map(_json_bytes)
line_protocol = st.lists(
    st.builds(
        lambda m, tags, fields, ts: f"{m}{tags} {fields}{ts}",
        st.sampled_from(["cpu", "my\\ m", "", "a,b"]),
        st.sampled_from(["", ",host=h1", ",device_id=d\\ 1,x=y", ",host=", ",a=1,a=2"]),
        st.sampled_from(
            ["v=1", 'v=1i,s="x y"', "b=t", 'v="open', "v=", "v=1,v=2", "=1", "v=1e999"]
        ),
        st.sampled_from(["", " 1795251000000000000", " 17", " x", " -1"]),
    )
    | st.text(max_size=30),
    min_size=1,
    max_size=3,
).map(lambda lines: "\n".join(lines).encode())
telegraf_docs = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["cpu", "", "a/b"]) | field_values,
        "tags": st.dictionaries(st.sampled_from(["host", "device", "x"]), field_values, max_size=2),
        "fields": st.dictionaries(st.sampled_from(["v", "w", "host"]), field_values, max_size=3),
        "timestamp": st.sampled_from([1_795_251_000, 1_795_251_000_000]) | field_values,
    },
)
telegraf_values = (
    telegraf_docs | st.lists(telegraf_docs, max_size=3).map(lambda m: {"metrics": m})
).map(_json_bytes)
flat_docs = st.fixed_dictionaries(
    {"device_id": st.just("d-1"), "timestamp": st.just(1_795_251_000)},
    optional={"metric": field_values, "value": field_values, "unit": field_values},
).map(_json_bytes)

raw_values = (
    st.none()
    | senml_packs
    | line_protocol
    | telegraf_values
    | flat_docs
    | _near(VALID_SENSOR)
    | _near(VALID_WEB)
    | st.binary(max_size=200)
    | sensor_docs.map(_json_bytes)
    | web_docs.map(_json_bytes)
    | json_values.map(_json_bytes)
    | log_lines
    | raw_events
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=raw_values, content_type=CONTENT_TYPES, key=st.none() | st.binary(max_size=20))
def test_the_cleaner_accepts_or_rejects_with_a_known_reason(
    value: bytes | None, content_type: str, key: bytes | None
) -> None:
    cleaner = Cleaner(CleaningRules())
    try:
        events = cleaner.clean_all(value, key, content_type, NOW_US)
    except RecordRejected as rejected:
        assert rejected.reason in REASONS
        assert rejected.message
        return
    assert events
    assert len({event.event_id for event in events}) == len(events)
    for event in events:
        assert event.event_id and event.entity_id
        assert event.WhichOneof("body") in ("sensor_reading", "web_request")
        for measurement in event.sensor_reading.measurements:
            assert measurement.value == measurement.value  # never NaN
        event.SerializeToString()  # every accepted event can be published


@settings(max_examples=500, deadline=None)
@given(
    values=st.lists(st.tuples(raw_values, CONTENT_TYPES), min_size=1, max_size=20),
    repeat=st.booleans(),
)
def test_every_record_has_exactly_one_outcome(
    values: list[tuple[bytes | None, str]], repeat: bool
) -> None:
    handler = RecordHandler(
        Cleaner(CleaningRules()),
        DedupWindow({}, 60_000),
        source_topic="raw",
        clean_topic="clean",
        dlq_topic="dlq",
    )
    records = values + values if repeat else values
    outcomes = [
        handler.handle(0, offset, None, value, [("content-type", ct.encode())], NOW_US)
        for offset, (value, ct) in enumerate(records)
    ]
    assert len(outcomes) == len(records)
    for offset, outcome in enumerate(outcomes):
        assert outcome.kind in ("clean", "dead_letter", "duplicate")
        assert (outcome.topic == "") == (outcome.kind == "duplicate")
        if outcome.kind == "clean":
            # Every clean event names the raw record it came from.
            assert outcome.value is not None
            for value in [outcome.value, *(extra[1] for extra in outcome.more)]:
                source = events_pb2.CleanEvent.FromString(value).source
                assert (source.topic, source.partition, source.offset) == ("raw", 0, offset)
        else:
            assert not outcome.more
    if repeat:
        # The second copy of an accepted record is a duplicate, never clean again.
        half = len(values)
        for first, second in zip(outcomes[:half], outcomes[half:], strict=True):
            if first.kind == "clean":
                assert second.kind == "duplicate"
            if first.kind == "dead_letter":
                assert second.kind == "dead_letter" and second.reason == first.reason


def test_a_record_read_again_at_its_position_is_dead_lettered_once() -> None:
    """Offsets a rebalance hands back can trail outputs already committed:
    the record read again there is a duplicate, as a clean event read again
    is; the same bytes at another position are dead-lettered again."""
    dedup = DedupWindow({}, 60_000)
    handler = RecordHandler(
        Cleaner(CleaningRules()), dedup, source_topic="raw", clean_topic="clean", dlq_topic="dlq"
    )
    headers = [("content-type", b"application/json")]
    first = handler.handle(1, 7, None, b"{not json", headers, NOW_US)
    assert first.kind == "dead_letter"
    again = handler.handle(1, 7, None, b"{not json", headers, NOW_US + 1_000_000)
    assert (again.kind, again.topic, again.event_id) == ("duplicate", "", "raw/1/7")
    elsewhere = handler.handle(1, 8, None, b"{not json", headers, NOW_US)
    assert elsewhere.kind == "dead_letter"
    # The position is a pending id like an event's: it is stored with the batch's.
    assert [entry for group in dedup.take_sightings() for entry, _ in group.entries] == [
        b"\x00dead-letter:raw/1/7",
        b"\x00dead-letter:raw/1/8",
    ]


@pytest.mark.parametrize(
    "document",
    [{**VALID_SENSOR, "metrics": {"temperature": {"value": 20.5, "unit": "C"}}}, VALID_WEB],
    ids=["sensor", "web"],
)
def test_a_clean_event_names_its_raw_record(document: dict[str, Any]) -> None:
    handler = RecordHandler(
        Cleaner(CleaningRules()),
        DedupWindow({}, 60_000),
        source_topic="aistack.events.raw",
        clean_topic="clean",
        dlq_topic="dlq",
    )
    value = json.dumps(document).encode()
    outcome = handler.handle(2, 41, b"k", value, [("content-type", b"application/json")], NOW_US)
    assert outcome.kind == "clean" and outcome.value is not None
    event = events_pb2.CleanEvent.FromString(outcome.value)
    assert event.source == common_pb2.SourcePosition(
        topic="aistack.events.raw", partition=2, offset=41
    )


@settings(max_examples=800, deadline=None)
@given(
    value=_near(VALID_SENSOR) | _near(VALID_WEB),
    content_type=st.sampled_from(["", "application/json"]),
)
def test_near_valid_documents_are_accepted_or_rejected_cleanly(
    value: bytes, content_type: str
) -> None:
    cleaner = Cleaner(CleaningRules())
    try:
        event = cleaner.clean(value, b"key", content_type, NOW_US)
    except RecordRejected as rejected:
        assert rejected.reason in REASONS
        return
    assert event.entity_id
    assert event.event_time.seconds >= 0
    for measurement in event.sensor_reading.measurements:
        assert measurement.value == measurement.value  # never NaN


def test_a_record_of_several_readings_publishes_each_once() -> None:
    handler = RecordHandler(
        Cleaner(CleaningRules()),
        DedupWindow({}, 60_000),
        source_topic="raw",
        clean_topic="clean",
        dlq_topic="dlq",
    )
    pack = json.dumps(
        [
            {"bn": "dev-1:", "bt": 1_795_251_000, "bu": "Cel", "n": "temperature", "v": 20},
            {"n": "temperature", "t": 1, "v": 21},
            {"n": "temperature", "t": 2, "v": 22},
        ]
    ).encode()
    headers = [("content-type", b"application/senml+json")]
    outcome = handler.handle(3, 7, b"dev-1", pack, headers, NOW_US)
    assert outcome.kind == "clean" and outcome.value is not None and len(outcome.more) == 2
    records = [(outcome.key, outcome.value, outcome.headers), *outcome.more]
    events = [events_pb2.CleanEvent.FromString(value) for _, value, _ in records]
    assert [e.sensor_reading.measurements[0].value for e in events] == [20, 21, 22]
    assert {e.source.offset for e in events} == {7}
    assert all(key == b"dev-1" for key, _, _ in records)
    assert len({e.event_id for e in events}) == 3
    # Each record's headers carry its own event's id.
    assert [dict(h)[envelope.ID] for _, _, h in records] == [e.event_id.encode() for e in events]
    assert outcome.event_id == events[0].event_id
    # The producer's retry of the same pack, at another offset: nothing new.
    again = handler.handle(3, 8, b"dev-1", pack, headers, NOW_US)
    assert again.kind == "duplicate" and not again.more


def test_a_batch_decides_and_publishes_what_its_records_one_by_one_would() -> None:
    """``handle_batch`` over a mixed batch (common sensor readings, a SenML
    pack of three, a malformed record, repeats): the outcomes ``handle``
    gives each record in turn, and every record to publish handed over
    once, in order, from its source partition."""

    def handler() -> RecordHandler:
        return RecordHandler(
            Cleaner(CleaningRules()),
            DedupWindow({}, 60_000),
            source_topic="raw",
            clean_topic="clean",
            dlq_topic="dlq",
        )

    reading = json.dumps(
        {
            "event_id": "r-1",
            "device_id": "dev-1",
            "timestamp": 1_795_251_000,
            "metrics": {"temperature": {"value": 20.5, "unit": "C"}},
        }
    ).encode()
    unnamed = reading.replace(b'"event_id": "r-1", ', b"")
    pack = json.dumps(
        [
            {"bn": "dev-2:", "bt": 1_795_251_000, "bu": "Cel", "n": "temperature", "v": 20},
            {"n": "temperature", "t": 1, "v": 21},
            {"n": "temperature", "t": 2, "v": 22},
        ]
    ).encode()
    json_type = [("content-type", b"application/json")]
    senml = [("content-type", b"application/senml+json")]
    batch = [
        RawRecord(0, 10, b"dev-1", reading, json_type),
        RawRecord(1, 4, b"dev-2", pack, senml),
        RawRecord(0, 11, None, b"{not json", json_type),
        RawRecord(1, 5, b"dev-1", unnamed, json_type),
        RawRecord(0, 12, b"dev-1", reading, json_type),  # a repeat
        RawRecord(1, 6, b"dev-1", unnamed, json_type),  # a repeat of the content
    ]
    published: list[tuple[int, str, bytes | None, bytes]] = []

    def publish(partition: int, topic: str, key: Any, value: bytes, headers: Any) -> None:
        published.append((partition, topic, key, value))

    decider = handler()
    if decider._compiled is not None:  # the readings take the path written out in the loop
        assert decider._compiled.clean(reading, NOW_US, 0, 10) is not None
        assert decider._compiled.clean(unnamed, NOW_US, 1, 5) is not None
    outcomes = decider.handle_batch(batch, NOW_US, publish)
    one_by_one = handler()
    expected = [one_by_one.handle(*record, NOW_US) for record in batch]

    assert [o.kind for o in outcomes] == [
        "clean",
        "clean",
        "dead_letter",
        "clean",
        "duplicate",
        "duplicate",
    ]
    assert [(o.kind, o.topic, o.key, o.event_id, o.reason) for o in outcomes] == [
        (o.kind, o.topic, o.key, o.event_id, o.reason) for o in expected
    ]
    sent = [
        (record.partition, outcome.topic, key, value)
        for record, outcome in zip(batch, outcomes, strict=True)
        if outcome.topic
        for key, value, _ in [(outcome.key, outcome.value, None), *outcome.more]
    ]
    assert published == sent
    assert [p for p, topic, _, _ in published] == [0, 1, 1, 1, 0, 1]
    # Records differ only in their ingest-time-free parts: same events.
    assert [
        events_pb2.CleanEvent.FromString(v).event_id for _, t, _, v in published if t == "clean"
    ] == [
        events_pb2.CleanEvent.FromString(v).event_id
        for o in expected
        if o.kind == "clean"
        for v in [o.value, *(extra[1] for extra in o.more)]
    ]
