"""svc_transform's JVM protobuf functions on a real local Spark."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from shared.contracts.aistack.v1 import common_pb2, events_pb2, features_pb2
from svc_transform.functions import (
    CLEAN_EVENT_ERROR,
    DECODE_CLEAN_EVENT,
    ENCODE_DEAD_LETTER,
    ENCODE_FEATURE_WINDOW,
)


def _sensor_event() -> bytes:
    event = events_pb2.CleanEvent(event_id="e-1", entity_id="thermo-7")
    event.event_time.FromDatetime(datetime(2026, 11, 22, 10, 0, 5, 250_000, tzinfo=UTC))
    event.sensor_reading.device_id = "thermo-7"
    event.sensor_reading.measurements.add(metric="temperature", value=21.5, unit="degC")
    event.sensor_reading.measurements.add(metric="humidity", value=40.0, unit="%")
    return event.SerializeToString()


def _web_event() -> bytes:
    event = events_pb2.CleanEvent(event_id="e-2", entity_id="web-1")
    event.event_time.FromDatetime(datetime(2026, 11, 22, 10, 0, 6, tzinfo=UTC))
    event.web_request.host = "web-1"
    event.web_request.method = "GET"
    event.web_request.path = "/api/orders"
    event.web_request.status = 503
    event.web_request.latency_ms = 12.5
    return event.SerializeToString()


def test_clean_events_decode_in_the_jvm(spark: Any) -> None:
    frame = spark.createDataFrame(
        [(_sensor_event(),), (_web_event(),), (b"\xff\x00 not protobuf",), (None,)], ["value"]
    )
    rows = frame.selectExpr(f"{DECODE_CLEAN_EVENT}(value) AS e").select("e.*").collect()

    sensor, web, garbage, empty = rows
    assert (sensor.event_id, sensor.entity_id, sensor.kind) == ("e-1", "thermo-7", "sensor")
    assert sensor.event_time.astimezone(UTC) == datetime(2026, 11, 22, 10, 0, 5, 250_000, UTC)
    assert [(m.metric, m.value, m.unit) for m in sensor.measurements] == [
        ("temperature", 21.5, "degC"),
        ("humidity", 40.0, "%"),
    ]
    assert sensor.error is None and sensor.web is None
    assert (web.kind, web.web.host, web.web.path, web.web.status, web.web.latency_ms) == (
        "web",
        "web-1",
        "/api/orders",
        503,
        12.5,
    )
    assert garbage.error and garbage.event_id is None
    assert empty.error == "record has no value"


def test_clean_event_error_agrees_with_the_decoder(spark: Any) -> None:
    no_entity = events_pb2.CleanEvent(event_id="e-3")
    no_entity.event_time.GetCurrentTime()
    no_entity.sensor_reading.device_id = "x"
    no_payload = events_pb2.CleanEvent(event_id="e-4", entity_id="thermo-1")
    no_payload.event_time.GetCurrentTime()
    values = [
        _sensor_event(),
        _web_event(),
        b"\xff\x00 not protobuf",
        None,
        no_entity.SerializeToString(),
        no_payload.SerializeToString(),
    ]
    frame = spark.createDataFrame([(v,) for v in values], ["value"])

    rows = frame.selectExpr(
        f"{CLEAN_EVENT_ERROR}(value) AS error", f"{DECODE_CLEAN_EVENT}(value).error AS decoded"
    ).collect()

    assert [r.error for r in rows] == [r.decoded for r in rows]
    assert [r.error for r in rows][:2] == [None, None]
    assert [r.error for r in rows][3:] == [
        "record has no value",
        "CleanEvent has no entity_id",
        "CleanEvent has neither a sensor reading nor a web request",
    ]
    assert rows[2].error.startswith("not an aistack.v1.CleanEvent")


def test_feature_windows_encode_in_the_jvm(spark: Any) -> None:
    encoded = spark.sql(
        f"""SELECT {ENCODE_FEATURE_WINDOW}(named_struct(
              'window_key', 'k1', 'entity_id', 'thermo-7', 'metric', 'temperature',
              'dimensions', map('site', 'plant-a'),
              'window_start', TIMESTAMP '2026-11-22 10:00:00',
              'window_end', TIMESTAMP '2026-11-22 10:01:00',
              'window_size', 60L, 'window_slide', 60L, 'unit', 'degC',
              'count', 3L, 'mean', 21.0D, 'min', 20.0D, 'max', 22.0D, 'stddev', 1.0D,
              'last', 22.0D, 'p50', 21.0D, 'p95', 22.0D,
              'last_event_time', TIMESTAMP '2026-11-22 10:00:59.5')) AS bytes"""
    ).collect()[0]["bytes"]

    window = features_pb2.FeatureWindow.FromString(bytes(encoded))
    assert (window.window_key, window.entity_id, window.metric) == ("k1", "thermo-7", "temperature")
    assert dict(window.dimensions) == {"site": "plant-a"}
    assert window.window_start == _ts(datetime(2026, 11, 22, 10, 0, tzinfo=UTC))
    assert window.window_size.seconds == window.window_slide.seconds == 60
    assert (window.count, window.mean, window.min, window.max, window.stddev) == (
        3,
        21.0,
        20.0,
        22.0,
        1.0,
    )
    assert window.last_event_time == _ts(datetime(2026, 11, 22, 10, 0, 59, 500_000, tzinfo=UTC))
    assert window.error_rate == 0.0  # absent from the struct: left unset


def test_dead_letters_encode_in_the_jvm(spark: Any) -> None:
    encoded = spark.sql(
        f"""SELECT {ENCODE_DEAD_LETTER}(named_struct(
              'reason', 'undecodable', 'message', 'not a CleanEvent',
              'original_value', X'FF00', 'original_key', CAST('k' AS BINARY),
              'original_headers', array(named_struct('key', 'h', 'value', X'01')),
              'source', named_struct('topic', 'aistack.events.clean', 'partition', 2,
                                     'offset', 41L),
              'service', 'svc_transform')) AS bytes"""
    ).collect()[0]["bytes"]

    letter = events_pb2.DeadLetter.FromString(bytes(encoded))
    assert (letter.reason, letter.service) == ("undecodable", "svc_transform")
    assert letter.original_value == b"\xff\x00" and letter.original_key == b"k"
    assert list(letter.original_headers) == [common_pb2.Header(key="h", value=b"\x01")]
    assert (letter.source.topic, letter.source.partition, letter.source.offset) == (
        "aistack.events.clean",
        2,
        41,
    )


def _ts(at: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(at)
    return stamp
