"""InfluxDB line protocol and Telegraf JSON metrics, and the flat single reading."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.contracts.aistack.v1 import events_pb2
from svc_ingest import influx
from svc_ingest.cleaner import Cleaner, content_hash
from svc_ingest.rejection import REASONS, RecordRejected
from svc_ingest.rules import CleaningRules

NOW_US = 1_795_251_600 * 1_000_000  # 2026-11-21T09:00:00Z
T0 = 1_795_251_000  # ten minutes before NOW
JSON = "application/json"
TEXT = "text/plain"


def clean(value: bytes, content_type: str, key: bytes | None = None) -> list[Any]:
    return Cleaner(CleaningRules()).clean_all(value, key, content_type, NOW_US)


def reason(value: bytes, content_type: str, key: bytes | None = None) -> str:
    with pytest.raises(RecordRejected) as caught:
        clean(value, content_type, key)
    assert caught.value.reason in REASONS and caught.value.message
    return caught.value.reason


def measurements(event: events_pb2.CleanEvent) -> list[tuple[str, float, str]]:
    return [(m.metric, m.value, m.unit) for m in event.sensor_reading.measurements]


# Line protocol -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "measurement", "tags", "fields", "time"),
    [
        ("cpu usage=1.5", "cpu", {}, {"usage": 1.5}, None),
        (
            "cpu,host=a,region=eu usage=1.5,n=2i,u=3u,ok=t,bad=FALSE 1700000000000000000",
            "cpu",
            {"host": "a", "region": "eu"},
            {"usage": 1.5, "n": 2.0, "u": 3.0, "ok": True, "bad": False},
            1_700_000_000_000_000_000,
        ),
        (
            'my\\ meas\\,x,tag\\ k\\=1=v\\,a\\ l f\\=k="s p\\"q\\\\",g=-1e3 5',
            "my meas,x",
            {"tag k=1": "v,a l"},
            {"f=k": 's p"q\\', "g": -1000.0},
            5,
        ),
        ('m s="a,b c=d" 7', "m", {}, {"s": "a,b c=d"}, 7),
    ],
)
def test_line_protocol_is_parsed_with_influxdb_escapes(
    line: str, measurement: str, tags: dict[str, str], fields: dict[str, Any], time: Any
) -> None:
    assert influx.parse_line(line) == influx.Point(measurement, tags, fields, time)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("cpu", "malformed_line_protocol"),  # no fields
        ("cpu usage", "malformed_line_protocol"),
        (",host=a usage=1", "malformed_line_protocol"),  # no measurement
        ("cpu,host= usage=1", "malformed_line_protocol"),
        ("cpu,host usage=1", "malformed_line_protocol"),
        ("cpu usage=abc", "malformed_line_protocol"),
        ('cpu s="open', "malformed_line_protocol"),
        ("cpu usage=1 17e9", "malformed_line_protocol"),
        ("cpu n=-1u", "malformed_line_protocol"),
        ("cpu,a=1,a=2 usage=1", "duplicate_key"),
        ("cpu usage=1,usage=2", "duplicate_key"),
        ("cpu n=" + "9" * 5000 + "i", "non_finite"),
    ],
)
def test_malformed_lines_have_a_reason(line: str, why: str) -> None:
    with pytest.raises(RecordRejected) as caught:
        influx.parse_line(line)
    assert caught.value.reason == why


def test_line_protocol_lines_become_one_event_each() -> None:
    text = (
        b"# from telegraf\n"
        b"weather,device_id=Station-1,site=roof temperature=21.5,humidity=40i,"
        b'status="ok" 1795251000000000000\r\n'
        b"\n"
        b"weather,host=gw-2 temperature=19,raining=true 1795251000000\n"
    )
    value = text
    first, second = clean(value, TEXT)
    assert first.entity_id == "station-1"
    assert first.event_time.ToMicroseconds() == T0 * 1_000_000
    assert measurements(first) == [
        ("weather.temperature", 21.5, ""),
        ("weather.humidity", 40.0, ""),
    ]
    assert dict(first.attributes) == {"site": "roof", "status": "ok"}
    # A device tag wins over host; host names the entity when there is none.
    assert second.entity_id == "gw-2"
    assert second.event_time.ToMicroseconds() == T0 * 1_000_000  # ms, told by magnitude
    assert measurements(second) == [("weather.temperature", 19.0, ""), ("weather.raining", 1.0, "")]
    assert [first.event_id, second.event_id] == [f"{content_hash(value)}-{i}" for i in (0, 1)]


def test_line_protocol_without_content_type_and_without_time_or_tags() -> None:
    (event,) = clean(b"power watts=12.5", "", key=b"plug-3")
    assert event.entity_id == "plug-3"  # the record key names the source
    assert event.event_time.ToMicroseconds() == NOW_US  # no timestamp: now, as InfluxDB
    assert measurements(event) == [("power.watts", 12.5, "")]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"power watts=12.5", "missing_field"),  # no entity tag and no key
        (b'power,host=a state="on"', "missing_field"),  # no number
        (b'power,host=a,state=x state="on",w=1', "duplicate_key"),  # tag and field
        (b"power,host=a w=1 99999999999999999999999", "invalid_timestamp"),
        (b"power,host=a w=1 1795260000000000000", "future_timestamp"),
        (b"power,host=a w=1\npower,host=a w=", "malformed_line_protocol"),
        (b"power,host=a bad-name/x=1", "invalid_field"),  # not a metric name
        (b"not a log line at all", "malformed_log_line"),  # no "=": neither format
        (
            b'1.2.3.4 - - [21/Nov/2026:08:00:00 +0000] "GET /?a=b HTTP/1.1" 2OO 1',
            "malformed_log_line",
        ),
    ],
)
def test_bad_line_protocol_records_are_dead_lettered(value: bytes, why: str) -> None:
    assert reason(value, TEXT) == why


def test_a_bad_line_is_named_by_its_number() -> None:
    with pytest.raises(RecordRejected, match="line 2"):
        clean(b"m,host=a v=1\nm,host=a v=x", TEXT)


def test_access_log_lines_still_parse_and_may_share_a_record() -> None:
    line = b'203.0.113.9 - - [21/Nov/2026:08:00:00 +0000] "GET /a?b=c HTTP/1.1" 200 5'
    (web,) = clean(line, TEXT, key=b"web-1")
    assert web.web_request.path == "/a?b=c"
    both = clean(line + b"\nm,host=a v=1 1795251000", TEXT, key=b"web-1")
    assert [e.WhichOneof("body") for e in both] == ["web_request", "sensor_reading"]


# Telegraf JSON ------------------------------------------------------------------


TELEGRAF = {
    "name": "environment",
    "tags": {"host": "telegraf-1", "device": "Sensor-7", "room": "lab"},
    "fields": {"temperature": 21.5, "co2": 415, "door_open": False, "status": "ok"},
    "timestamp": T0,
}


def test_a_telegraf_metric_is_one_event() -> None:
    (event,) = clean(json.dumps(TELEGRAF).encode(), JSON)
    assert event.entity_id == "sensor-7"
    assert event.event_time.ToMicroseconds() == T0 * 1_000_000  # seconds, Telegraf's default
    assert measurements(event) == [
        ("environment.temperature", 21.5, ""),
        ("environment.co2", 415.0, ""),
        ("environment.door_open", 0.0, ""),
    ]
    assert dict(event.attributes) == {"host": "telegraf-1", "room": "lab", "status": "ok"}


def test_a_telegraf_batch_is_one_event_per_metric_and_is_sniffed() -> None:
    other = {**TELEGRAF, "tags": {"host": "telegraf-2"}, "timestamp": T0 * 1000}
    value = json.dumps({"metrics": [TELEGRAF, other]}).encode()
    first, second = clean(value, "")
    assert (first.entity_id, second.entity_id) == ("sensor-7", "telegraf-2")
    assert second.event_time.ToMicroseconds() == T0 * 1_000_000  # ms by magnitude
    assert [first.event_id, second.event_id] == [f"{content_hash(value)}-{i}" for i in (0, 1)]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"timestamp": None}, "missing_field"),
        ({"timestamp": "later"}, "invalid_timestamp"),
        ({"name": ""}, "missing_field"),
        ({"tags": {"host": 1}}, "invalid_type"),
        ({"tags": {}}, "missing_field"),  # no entity tag, no key
        ({"fields": []}, "invalid_type"),
        ({"fields": {}}, "missing_field"),
        ({"fields": {"x": None}}, "invalid_type"),
        ({"fields": {"x": {"y": 1}}}, "invalid_type"),
        ({"fields": {"status": "ok"}}, "missing_field"),
        ({"fields": {"room": "x", "v": 1}}, "duplicate_key"),
        ({"name": "bad/name"}, "invalid_field"),
    ],
)
def test_bad_telegraf_metrics_are_dead_lettered(change: dict[str, Any], why: str) -> None:
    doc = {k: v for k, v in {**TELEGRAF, **change}.items() if v is not None}
    assert reason(json.dumps(doc).encode(), JSON) == why
    batch = {"metrics": [TELEGRAF, doc]}
    with pytest.raises(RecordRejected, match=r"metrics\[1\]"):
        clean(json.dumps(batch).encode(), JSON)


# The flat single reading -------------------------------------------------------


@pytest.mark.parametrize(
    "doc",
    [
        {
            "device_id": "Thermo-1",
            "timestamp": T0,
            "metric": "temperature",
            "value": 71.6,
            "unit": "°F",
        },
        {
            "deviceId": "thermo-1",
            "ts": f"{T0}000",
            "metric": "Temperature",
            "value": "22",
            "unit": "C",
            "firmware": "1.2",
        },
        {
            "device": "thermo-1",
            "time": "2026-11-21T08:50:00Z",
            "metric": "temperature",
            "value": 295.15,
            "unit": "K",
        },
    ],
)
def test_the_flat_single_reading_is_one_measurement(doc: dict[str, Any]) -> None:
    (event,) = clean(json.dumps(doc).encode(), JSON)
    assert event.entity_id == "thermo-1"
    assert event.event_time.ToMicroseconds() == T0 * 1_000_000
    ((metric, value, unit),) = measurements(event)
    assert (metric, round(value, 6), unit) == ("temperature", 22.0, "degC")
    assert set(event.attributes) <= {"firmware"}  # metric, value, unit are not attributes


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"value": None}, "missing_field"),
        ({"value": "warm"}, "invalid_type"),
        ({"unit": None}, "missing_field"),  # temperature needs a unit
        ({"unit": "furlongs"}, "unknown_unit"),
        ({"value": 900}, "out_of_range"),
        ({"metric": "bad name!"}, "invalid_field"),
        ({"device_id": None}, "unknown_event_kind"),
        ({"timestamp": None}, "missing_field"),
    ],
)
def test_bad_flat_readings_are_dead_lettered(change: dict[str, Any], why: str) -> None:
    doc = {"device_id": "t-1", "timestamp": T0, "metric": "temperature", "value": 20, "unit": "C"}
    doc = {k: v for k, v in {**doc, **change}.items() if v is not None}
    assert reason(json.dumps(doc).encode(), JSON) == why
