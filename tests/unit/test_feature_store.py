"""The feature store's contract: names, the online value and the offline layout."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.contracts.aistack.v1.common_pb2 import OffsetRange
from shared.contracts.aistack.v1.events_pb2 import CleanEvent
from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.errors import FailedPrecondition
from shared.feature_store import (
    DIMENSIONS,
    FEATURE_STATS,
    OFFLINE_COLUMNS,
    PARTITION_COLUMNS,
    SERIES_COLUMNS,
    decode_window,
    encode_window,
    merge_source_column,
    merge_sources,
    online_field,
    online_key,
    partition_path,
    window_stats,
)
from svc_model.features import feature_row
from tests.unit.test_trainer_data import SOURCES

END = datetime(2026, 11, 22, 10, 1, tzinfo=UTC)


def a_window() -> FeatureWindow:
    window = FeatureWindow(
        window_key="0f3a",
        entity_id="web-1",
        metric="http.latency_ms",
        unit="ms",
        count=12,
        mean=21.5,
        min=20.0,
        max=23.0,
        stddev=0.5,
        last=22.0,
        p50=21.4,
        p95=22.8,
        error_rate=0.25,
    )
    window.dimensions["path"] = "/api/orders"
    window.window_end.FromDatetime(END)
    window.window_size.FromSeconds(60)
    return window


def test_a_window_round_trips_through_its_stored_bytes() -> None:
    window = a_window()
    stored = encode_window(window)
    assert decode_window(stored) == window
    # The same bytes as the window's record on the features topic.
    assert FeatureWindow.FromString(stored) == window


def test_a_window_carries_the_offset_ranges_of_its_clean_events() -> None:
    window = a_window()
    clean = "aistack.events.clean"
    ranges = [OffsetRange(topic=clean, partition=0, min_offset=7, max_offset=40, count=12)]
    window.sources.extend(ranges)
    assert list(decode_window(encode_window(window)).sources) == ranges


def test_records_written_before_sources_still_decode() -> None:
    # What svc_transform wrote before FeatureWindow had field 20, and
    # svc_ingest before CleanEvent.source: the same messages without them.
    window = decode_window(encode_window(a_window()))
    assert list(window.sources) == [] and window == a_window()
    # Its readers take it as before: svc_model's input row, and the JSON of older stores.
    row = feature_row(window, len(FEATURE_STATS), "http.latency_ms|path=/api/orders@tumbling-60s")
    np.testing.assert_array_equal(row, np.asarray(window_stats(a_window()), np.float32))
    assert list(decode_window(b'{"count": "3", "mean": 1.5}').sources) == []
    event = CleanEvent(event_id="e-1", entity_id="t-1")
    event.sensor_reading.measurements.add(metric="temperature", value=20.0, unit="degC")
    decoded = CleanEvent.FromString(event.SerializeToString())
    assert not decoded.HasField("source") and decoded.source.topic == ""
    assert decoded == event


def test_field_names_carry_the_path_only_when_there_is_one() -> None:
    assert online_field("temperature", "tumbling-60s") == "temperature@tumbling-60s"
    assert online_field("temperature", "tumbling-60s", "") == "temperature@tumbling-60s"
    assert (
        online_field("http.latency_ms", "sliding-300s-every-60s", "/api/orders")
        == "http.latency_ms|path=/api/orders@sliding-300s-every-60s"
    )
    assert online_key("aistack:features:", "sensor-7") == "aistack:features:sensor-7"


def test_statistics_come_out_in_feature_order() -> None:
    assert FEATURE_STATS == ("mean", "stddev", "min", "max", "count", "p50", "p95")
    assert window_stats(a_window()) == (21.5, 0.5, 20.0, 23.0, 12.0, 21.4, 22.8)
    # Every statistic is a FeatureWindow field, so the online value holds it.
    assert set(FEATURE_STATS) <= set(FeatureWindow.DESCRIPTOR.fields_by_name)


def test_a_json_window_from_before_the_protobuf_store_is_still_read() -> None:
    legacy = {
        "window_key": "0f3a",
        "window_start": "2026-11-22T10:00:00+00:00",
        "window_end": END.isoformat(),
        "unit": "degC",
        "count": 12,
        "mean": 21.5,
        "min": 20.0,
        "max": 23.0,
        "stddev": 0.5,
        "last": 22.0,
        "p50": 21.4,
        "p95": 22.8,
        "error_rate": None,
    }
    window = decode_window(json.dumps(legacy).encode())
    assert window_stats(window) == (21.5, 0.5, 20.0, 23.0, 12.0, 21.4, 22.8)
    assert window.window_end.ToDatetime(tzinfo=UTC) == END
    assert (window.window_key, window.unit, window.error_rate) == ("0f3a", "degC", 0.0)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"\x00 not a window", "not an aistack.v1.FeatureWindow"),
        (b"{not json", "not a feature window (JSON)"),
        (b'{"count": "many"}', "not a feature window (JSON)"),
    ],
)
def test_a_value_that_is_no_window_is_a_failed_precondition(value: bytes, message: str) -> None:
    with pytest.raises(FailedPrecondition, match=re.escape(message)):
        decode_window(value)


def test_the_offline_layout() -> None:
    assert PARTITION_COLUMNS == ("date", "metric", "window", "batch")
    path = partition_path(date="2026-11-22", metric="temperature", window="tumbling-60s", batch=3)
    assert path == "date=2026-11-22/metric=temperature/window=tumbling-60s/batch=3"
    # A partition is no file column; a series is a window's dimensions but its metric.
    assert not set(PARTITION_COLUMNS) & set(OFFLINE_COLUMNS)
    assert SERIES_COLUMNS == ("entity_id", "path", "unit")
    assert set(DIMENSIONS) - set(SERIES_COLUMNS) == {"metric"}
    # Every column but the path (a FeatureWindow dimension) is a FeatureWindow field.
    fields = set(FeatureWindow.DESCRIPTOR.fields_by_name)
    assert set(OFFLINE_COLUMNS) - fields == {"path"}


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.one_of(
            st.none(),
            st.lists(
                st.fixed_dictionaries(
                    {
                        "topic": st.sampled_from(["aistack.events.clean", "b", "Z", "é"]),
                        "partition": st.integers(0, 3),
                        "min_offset": st.integers(0, 10**12),
                        "max_offset": st.integers(0, 10**12),
                        "count": st.integers(1, 10**6),
                    }
                ),
                max_size=4,
            ),
        ),
        max_size=12,
    ),
    chunks=st.integers(1, 3),
)
def test_the_arrow_merge_of_a_sources_column_is_the_python_merge(
    rows: list[list[dict[str, object]] | None], chunks: int
) -> None:
    import pyarrow as pa
    from pyarrow.parquet import read_table, write_table

    table = pa.table({"sources": pa.array(rows, type=SOURCES)})
    size = max(1, -(-len(rows) // chunks))
    column = pa.chunked_array(
        [table.column(0).combine_chunks().slice(i, size) for i in range(0, len(rows), size)]
        or [table.column(0).combine_chunks()]
    )
    expected = merge_sources(source for sources in rows for source in sources or ())
    assert merge_source_column(column) == expected
    # Through Parquet, as batch scoring reads it, the JSON it writes is the same.
    sink = pa.BufferOutputStream()
    write_table(table, sink)
    read = read_table(pa.BufferReader(sink.getvalue()))[0]
    before = merge_sources(source for sources in read.to_pylist() for source in sources or ())
    assert json.dumps(merge_source_column(read)) == json.dumps(before)
