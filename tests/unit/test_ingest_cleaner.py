from __future__ import annotations

import json
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from shared.contracts.aistack.v1 import events_pb2
from svc_ingest.cleaner import Cleaner, content_hash
from svc_ingest.rejection import REASONS, RecordRejected
from svc_ingest.rules import CleaningRules

NOW_US = 1_795_251_600 * 1_000_000  # 2026-11-21T09:00:00Z
JSON = "application/json"


@pytest.fixture
def cleaner() -> Cleaner:
    return Cleaner(CleaningRules())


def sensor(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "event_id": "evt-1",
        "device_id": "  Thermo-0042 ",
        "timestamp": "2026-11-21T09:30:00+01:00",
        "metrics": {
            "temperature": {"value": 71.6, "unit": "°F"},
            "Humidity": {"value": "40.5", "unit": "%"},
        },
        "attributes": {"site": "plant-a"},
    }
    doc.update(overrides)
    return doc


def clean_json(cleaner: Cleaner, doc: Any, content_type: str = JSON) -> events_pb2.CleanEvent:
    return cleaner.clean(json.dumps(doc).encode(), None, content_type, NOW_US)


def reason_of(
    cleaner: Cleaner, value: bytes | None, content_type: str = "", key: bytes | None = None
) -> str:
    with pytest.raises(RecordRejected) as caught:
        cleaner.clean(value, key, content_type, NOW_US)
    assert caught.value.reason in REASONS
    assert caught.value.message
    return caught.value.reason


def test_a_sensor_reading_is_normalised(cleaner: Cleaner) -> None:
    event = clean_json(cleaner, sensor(firmware="1.2.3", rssi=-70))
    assert event.event_id == "evt-1"
    assert event.entity_id == "thermo-0042"
    assert event.event_time.ToJsonString() == "2026-11-21T08:30:00Z"
    reading = event.sensor_reading
    assert reading.device_id == "thermo-0042"
    by_name = {m.metric: m for m in reading.measurements}
    assert by_name["temperature"].value == pytest.approx(22.0)
    assert by_name["temperature"].unit == "degC"
    assert by_name["humidity"].value == 40.5  # a numeric string became a number
    # Unknown fields are kept as attributes, not rejected.
    assert dict(event.attributes) == {"site": "plant-a", "firmware": "1.2.3", "rssi": "-70"}


def test_metrics_may_be_a_list_and_times_epoch_numbers(cleaner: Cleaner) -> None:
    event = clean_json(
        cleaner,
        sensor(
            timestamp=1_795_251_000_123,
            metrics=[
                {"name": "pressure", "value": 101.3, "unit": "kPa"},
                {"metric": "steps", "value": 3},
            ],
        ),
    )
    assert event.event_time.ToMicroseconds() == 1_795_251_000_123_000
    assert [(m.metric, round(m.value, 6), m.unit) for m in event.sensor_reading.measurements] == [
        ("pressure", 1013.0, "hPa"),
        ("steps", 3.0, ""),
    ]


def test_a_json_access_log_is_a_web_request(cleaner: Cleaner) -> None:
    doc = {
        "host": "WEB-03",
        "remote_addr": "2001:DB8::1",
        "time": "2026-11-21T08:59:00Z",
        "request": "get /api/items?id=3 http/1.1",
        "status": "404",
        "body_bytes_sent": 512,
        "request_time": 0.0125,
        "http_user_agent": "curl/8.0",
        "upstream": "10.0.0.1:8080",
    }
    event = clean_json(cleaner, doc)
    web = event.web_request
    assert event.entity_id == web.host == "web-03"
    assert (web.method, web.path, web.protocol) == ("GET", "/api/items?id=3", "HTTP/1.1")
    assert web.status == 404 and web.response_bytes == 512
    assert web.latency_ms == pytest.approx(12.5)
    assert web.client_address == "2001:db8::1"
    assert web.user_agent == "curl/8.0"
    assert event.attributes["upstream"] == "10.0.0.1:8080"
    assert event.event_id == content_hash(json.dumps(doc).encode())


LINE = (
    b'203.0.113.9 - frank [21/Nov/2026:09:59:00 +0100] "POST /login HTTP/1.1" 302 0 '
    b'"https://example.com/" "Mozilla/5.0 (X11; Linux)" 0.004'
)


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain; charset=utf-8", ""])
def test_a_combined_log_line_is_a_web_request(cleaner: Cleaner, content_type: str) -> None:
    event = cleaner.clean(LINE, b"Web-1", content_type, NOW_US)
    web = event.web_request
    assert event.entity_id == "web-1"
    assert event.event_time.ToJsonString() == "2026-11-21T08:59:00Z"
    assert (web.client_address, web.method, web.path, web.status) == (
        "203.0.113.9",
        "POST",
        "/login",
        302,
    )
    assert web.referer == "https://example.com/"
    assert web.user_agent == "Mozilla/5.0 (X11; Linux)"
    assert web.latency_ms == pytest.approx(4.0)
    # No producer id: the content hash, the same for a retry of the same bytes.
    assert event.event_id == content_hash(LINE)


def test_a_common_log_line_without_referer_or_key(cleaner: Cleaner) -> None:
    line = b'10.0.0.7 - - [21/Nov/2026:08:00:00 +0000] "GET / HTTP/1.0" 200 -'
    event = cleaner.clean(line, None, "text/plain", NOW_US)
    assert event.entity_id == "unknown"
    assert event.web_request.response_bytes == 0


def test_protobuf_raw_events_are_cleaned(cleaner: Cleaner) -> None:
    when = Timestamp(seconds=1_795_251_000)
    raw = events_pb2.RawEvent(event_id="p-1", event_time=when, attributes={"fw": "2"})
    raw.sensor_reading.device_id = "Dev-9"
    raw.sensor_reading.measurements.add(metric="Temperature", value=300.15, unit="K")
    event = cleaner.clean(raw.SerializeToString(), None, "application/x-protobuf", NOW_US)
    assert (event.event_id, event.entity_id) == ("p-1", "dev-9")
    assert event.sensor_reading.measurements[0].value == pytest.approx(27.0)
    assert event.attributes["fw"] == "2"
    # Detected without a content-type too.
    assert cleaner.clean(raw.SerializeToString(), None, "", NOW_US) == event

    web = events_pb2.RawEvent(event_time=when)
    web.web_request.host = "Edge-1"
    web.web_request.method = "get"
    web.web_request.path = "/x"
    web.web_request.status = 200
    assert (
        cleaner.clean(web.SerializeToString(), None, "application/x-protobuf", NOW_US).entity_id
        == "edge-1"
    )

    line = events_pb2.RawEvent(log_line=LINE.decode())
    assert (
        cleaner.clean(
            line.SerializeToString(), b"h", "application/x-protobuf", NOW_US
        ).web_request.status
        == 302
    )


@pytest.mark.parametrize(
    ("value", "content_type", "reason"),
    [
        (None, JSON, "null_value"),
        (b"", JSON, "empty"),
        (b"x" * 1_048_577, JSON, "too_large"),
        (b'{"device_id": "\xff"}', JSON, "invalid_utf8"),
        (b'\xef\xbb\xbf{"device_id": "a"}', JSON, "byte_order_mark"),
        (b'\xef\xbb\xbf{"device_id": "a"}', "", "byte_order_mark"),
        (b'{"device_id": "a", ', JSON, "invalid_json"),
        (b'{"device_id": "a", "device_id": "b"}', JSON, "duplicate_key"),
        (b"[1, 2]", JSON, "not_an_object"),
        (b'"text"', JSON, "not_an_object"),
        (b"42", JSON, "not_an_object"),
        (b"[" * 40 + b"]" * 40, "", "too_deep"),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, JSON, "too_deep"),
        (b'{"device_id": "a", "timestamp": 1, "metrics": {"t": NaN}}', JSON, "non_finite"),
        (b'{"device_id": "a", "timestamp": 1, "metrics": {"t": -Infinity}}', JSON, "non_finite"),
        (b'{"device_id": "a", "timestamp": 1, "metrics": {"t": 1e999}}', JSON, "non_finite"),
        (b"\x0a\x05\xff\xff", "application/x-protobuf", "invalid_protobuf"),
        (b"not a log line at all", "text/plain", "malformed_log_line"),
        (b"not a log line at all", "", "malformed_log_line"),
        (b"<xml/>", "application/xml", "unsupported_content_type"),
        (b'{"hello": "world"}', JSON, "unknown_event_kind"),
    ],
)
def test_malformed_records_get_their_reason(
    cleaner: Cleaner, value: bytes | None, content_type: str, reason: str
) -> None:
    assert reason_of(cleaner, value, content_type) == reason


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"device_id": None}, "missing_field"),
        ({"device_id": ["a"]}, "invalid_type"),
        ({"device_id": ""}, "missing_field"),
        ({"timestamp": "soon"}, "invalid_timestamp"),
        ({"timestamp": "2026-11-22T09:00:00Z"}, "future_timestamp"),
        ({"metrics": {}}, "missing_field"),
        ({"metrics": "hot"}, "invalid_type"),
        ({"metrics": {"temperature": {"value": 1, "unit": "furlongs"}}}, "unknown_unit"),
        ({"metrics": {"temperature": {"value": 900, "unit": "C"}}}, "out_of_range"),
        ({"metrics": {"humidity": {"value": 150, "unit": "%"}}}, "out_of_range"),
        ({"metrics": {"temperature": {"value": {"a": 1}, "unit": "C"}}}, "invalid_type"),
        ({"metrics": {"temperature": {"value": "warm", "unit": "C"}}}, "invalid_type"),
        ({"metrics": {"temperature": {"value": True, "unit": "C"}}}, "invalid_type"),
        ({"metrics": {"temperature": {"unit": "C"}}}, "missing_field"),
        ({"metrics": {"temperature": {"value": 1, "unit": "hPa"}}}, "unit_mismatch"),
        ({"metrics": {"bad name!": 1}}, "invalid_field"),
        ({"metrics": [{"name": "a", "value": 1}, {"name": "A", "value": 2}]}, "duplicate_key"),
        ({"attributes": [1, 2]}, "invalid_type"),
    ],
)
def test_invalid_sensor_fields_get_their_reason(
    cleaner: Cleaner, overrides: dict[str, Any], reason: str
) -> None:
    assert reason_of(cleaner, json.dumps(sensor(**overrides)).encode(), JSON) == reason


def test_missing_required_sensor_fields(cleaner: Cleaner) -> None:
    for field in ("timestamp", "metrics"):
        doc = sensor()
        del doc[field]
        assert reason_of(cleaner, json.dumps(doc).encode(), JSON) == "missing_field"


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"status": 700}, "invalid_field"),
        ({"status": "abc"}, "invalid_type"),
        ({"status": 10**30}, "invalid_field"),
        ({"method": "g e t"}, "invalid_field"),
        ({"path": "no-slash"}, "invalid_field"),
        ({"remote_addr": "not an address!"}, "invalid_field"),
        ({"bytes": -1}, "out_of_range"),
        ({"latency_ms": -5}, "out_of_range"),
        ({"protocol": "SPDY"}, "invalid_field"),
    ],
)
def test_invalid_web_fields_get_their_reason(
    cleaner: Cleaner, overrides: dict[str, Any], reason: str
) -> None:
    doc = {"host": "w", "time": "2026-11-21T08:00:00Z", "method": "GET", "path": "/", "status": 200}
    doc.update(overrides)
    assert reason_of(cleaner, json.dumps(doc).encode(), JSON) == reason


def test_ranges_and_limits_come_from_the_rules() -> None:
    strict = Cleaner(
        CleaningRules(metric_ranges={"temperature": (-10.0, 30.0)}, max_future_skew_us=0)
    )
    doc = sensor(metrics={"temperature": {"value": 35, "unit": "C"}})
    assert reason_of(strict, json.dumps(doc).encode(), JSON) == "out_of_range"
    ahead = sensor(timestamp=NOW_US // 1_000_000 + 1)
    assert reason_of(strict, json.dumps(ahead).encode(), JSON) == "future_timestamp"
    small = Cleaner(CleaningRules(max_payload_bytes=10))
    assert reason_of(small, json.dumps(sensor()).encode(), JSON) == "too_large"


def test_the_fast_json_path_still_sees_nested_duplicates_and_tricky_strings(
    cleaner: Cleaner,
) -> None:
    nested = b'{"device_id": "a", "timestamp": 1, "metrics": {"t": 1, "t": 2}}'
    assert reason_of(cleaner, nested, JSON) == "duplicate_key"
    tricky = sensor(note='quote": and colon', firmware={"a": '"x":'})
    event = clean_json(cleaner, tricky)
    assert event.attributes["note"] == 'quote": and colon'
    big = (
        b'{"device_id": "a", "timestamp": 1795251000, '
        b'"metrics": {"steps": 12345678901234567890123}}'
    )
    assert cleaner.clean(big, None, JSON, NOW_US).sensor_reading.measurements[0].value > 1e22


def test_a_unit_that_is_not_text_is_rejected_not_a_crash(cleaner: Cleaner) -> None:
    doc = sensor(metrics={"temperature": {"value": 20, "unit": ["C"]}})
    assert reason_of(cleaner, json.dumps(doc).encode(), JSON) == "invalid_type"
