"""Window arithmetic of svc_transform on a real local Spark, on static
frames, and the windows' way into the offline store."""

from __future__ import annotations

import json
import math
import statistics
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import functions as F

from shared.contracts.aistack.v1 import events_pb2, features_pb2
from shared.feature_store import event_series
from shared.settings import KafkaSettings, RedisSettings
from svc_transform.driver_parquet import SPARK_SCHEMA_KEY
from svc_transform.functions import MERGE_SKETCHES, SKETCH_PERCENTILE, summarise_panes
from svc_transform.sinks import WindowSink
from svc_transform.windows import (
    WEB_LATENCY,
    WindowSpec,
    aggregate,
    decode,
    feature_window_bytes,
    observations,
    running_windows,
)

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
CLEAN = "aistack.events.clean"


def sensor(entity: str, at: datetime, temperature: float) -> bytes:
    event = events_pb2.CleanEvent(event_id=f"{entity}-{at.timestamp()}", entity_id=entity)
    event.event_time.FromDatetime(at)
    event.sensor_reading.device_id = entity
    event.sensor_reading.measurements.add(metric="temperature", value=temperature, unit="degC")
    return event.SerializeToString()


def web(host: str, at: datetime, path: str, status: int, latency: float) -> bytes:
    event = events_pb2.CleanEvent(event_id=f"{host}-{at.timestamp()}", entity_id=host)
    event.event_time.FromDatetime(at)
    request = event.web_request
    request.host, request.method, request.path = host, "GET", path
    request.status, request.latency_ms = status, latency
    return event.SerializeToString()


def frame(spark: Any, values: list[bytes], partitions: list[int] | None = None) -> Any:
    """Kafka records of ``CLEAN``: in ``partitions`` (all 0 by default), each
    partition's offsets counting from 100 in list order."""
    chosen = partitions or [0] * len(values)
    offsets = [100 + chosen[:i].count(p) for i, p in enumerate(chosen)]
    rows = list(zip(values, [CLEAN] * len(values), chosen, offsets, strict=True))
    return spark.createDataFrame(rows, "value binary, topic string, partition int, offset long")


def source(partition: int, first: int, last: int, count: int) -> dict[str, Any]:
    return {
        "topic": CLEAN,
        "partition": partition,
        "min_offset": first,
        "max_offset": last,
        "count": count,
    }


def test_tumbling_windows_have_exact_statistics(spark: Any) -> None:
    first = [20.0, 22.0, 27.0]  # window [10:00, 10:01)
    second = [30.0]  # window [10:01, 10:02)
    values = [sensor("t-1", T0 + timedelta(seconds=10 * i), v) for i, v in enumerate(first)]
    values.append(sensor("t-1", T0 + timedelta(seconds=65), second[0]))
    values.append(b"\x00garbage")  # not a CleanEvent: no observation

    rows = aggregate(frame(spark, values), [WindowSpec(60, 60)], 30)
    got = {r.window_start.astimezone(UTC): r for r in rows.collect()}

    assert set(got) == {T0, T0 + timedelta(minutes=1)}
    w = got[T0]
    assert (w.entity_id, w.metric, w.unit, w["count"]) == ("t-1", "temperature", "degC", 3)
    assert (w.min, w.max, w.last) == (20.0, 27.0, 27.0)
    assert abs(w.mean - statistics.mean(first)) < 1e-9
    assert abs(w.stddev - statistics.stdev(first)) < 1e-9
    assert w.p50 == 22.0 and w.error_rate is None
    assert w.window_end.astimezone(UTC) == T0 + timedelta(minutes=1)
    assert w.date == "2026-11-22" and len(w.window_key) == 32
    # The garbage record (offset 104) is no clean event of any window.
    assert [s.asDict() for s in w.sources] == [source(0, 100, 102, 3)]
    lone = got[T0 + timedelta(minutes=1)]
    assert (lone["count"], lone.mean, lone.stddev) == (1, 30.0, 0.0)
    assert [s.asDict() for s in lone.sources] == [source(0, 103, 103, 1)]


def test_sliding_windows_count_each_event_in_every_window_it_falls_in(spark: Any) -> None:
    values = [sensor("t-2", T0 + timedelta(seconds=s), 1.0) for s in (0, 70, 130)]

    rows = aggregate(frame(spark, values), [WindowSpec(120, 60)], 0)
    counts = {r.window_start.astimezone(UTC): r["count"] for r in rows.collect()}

    assert counts == {
        T0 - timedelta(minutes=1): 1,
        T0: 2,
        T0 + timedelta(minutes=1): 2,
        T0 + timedelta(minutes=2): 1,
    }


def test_tumbling_and_sliding_windows_come_from_one_aggregation(spark: Any) -> None:
    values = [sensor("t-2", T0 + timedelta(seconds=s), float(s)) for s in (0, 70, 130)]
    specs = [WindowSpec(60, 60), WindowSpec(120, 60)]

    rows = aggregate(frame(spark, values), specs, 0).collect()
    got = {(r.window, r.window_start.astimezone(UTC)): r for r in rows}

    minute = timedelta(minutes=1)
    assert {k: r["count"] for k, r in got.items()} == {
        ("tumbling-60s", T0): 1,
        ("tumbling-60s", T0 + minute): 1,
        ("tumbling-60s", T0 + 2 * minute): 1,
        ("sliding-120s-every-60s", T0 - minute): 1,
        ("sliding-120s-every-60s", T0): 2,
        ("sliding-120s-every-60s", T0 + minute): 2,
        ("sliding-120s-every-60s", T0 + 2 * minute): 1,
    }
    both = got[("sliding-120s-every-60s", T0 + minute)]
    assert (both.min, both.max, both.last, both.window_size, both.window_slide) == (
        70.0,
        130.0,
        130.0,
        120,
        60,
    )
    assert both.window_end.astimezone(UTC) == T0 + 3 * minute
    # Same entity, metric and start, different spec: different keys.
    assert got[("tumbling-60s", T0)].window_key != got[("sliding-120s-every-60s", T0)].window_key


def test_sliding_window_statistics_merge_exactly_over_its_panes(spark: Any) -> None:
    # Three one-minute panes, uneven counts, all in one 3-minute window.
    values = [3.0, 4.0, 8.0, 100.0, 101.0, 7.5, 9.25, 11.0, 2.0]
    seconds = [1, 20, 59, 61, 62, 125, 130, 140, 179]
    events = [
        sensor("t-4", T0 + timedelta(seconds=s), v) for s, v in zip(seconds, values, strict=True)
    ]

    rows = aggregate(frame(spark, events), [WindowSpec(180, 60)], 0)
    whole = {r.window_start.astimezone(UTC): r for r in rows.collect()}[T0]

    assert (whole["count"], whole.min, whole.max, whole.last) == (9, 2.0, 101.0, 2.0)
    assert abs(whole.mean - statistics.mean(values)) < 1e-9
    assert abs(whole.stddev - statistics.stdev(values)) < 1e-9
    # percentile_approx's answer: the smallest value with that share at or below it.
    ordered = sorted(values)
    assert whole.p50 == ordered[4] and whole.p95 == ordered[8]


def test_merged_sketches_keep_percentile_approx_accuracy(spark: Any) -> None:
    # 9,000 distinct values spread over three panes of one 3-minute window.
    count = 9_000
    values = [float((i * 7_919) % count) for i in range(count)]  # a permutation of 0..8999
    events = [
        sensor("t-5", T0 + timedelta(seconds=i * 180 / count), v) for i, v in enumerate(values)
    ]

    rows = aggregate(frame(spark, events), [WindowSpec(180, 60)], 0)
    whole = {r.window_start.astimezone(UTC): r for r in rows.collect()}[T0]

    assert whole["count"] == count
    assert [s.asDict() for s in whole.sources] == [source(0, 100, 100 + count - 1, count)]
    # Relative rank error 1/10000: within one value of the exact ones here.
    assert abs(whole.p50 - 4_499) <= 1 and abs(whole.p95 - 8_549) <= 1


def test_a_series_of_repeated_values_keeps_small_exact_sketches(spark: Any) -> None:
    # 12,000 readings of 37 whole degrees over three panes of one 3-minute window.
    count, distinct = 12_000, 37
    values = [float((i * 7_919) % distinct) for i in range(count)]
    events = [
        sensor("t-5", T0 + timedelta(seconds=i * 180 / count), v) for i, v in enumerate(values)
    ]
    records = frame(spark, events)

    # A pane's sketch is each distinct value with its count, not its 4,000 values.
    panes = summarise_panes(records, 60).groupBy("window").agg(F.max(F.length("sketch")))
    assert {r[1] for r in panes.collect()} == {8 + 16 * distinct}

    rows = aggregate(records, [WindowSpec(180, 60)], 0)
    whole = {r.window_start.astimezone(UTC): r for r in rows.collect()}[T0]
    # Exact: the value at rank ceil(fraction * count), which percentile_approx
    # approximates within one ten-thousandth of the ranks.
    ordered = sorted(values)
    assert whole.p50 == ordered[math.ceil(0.5 * count) - 1]
    assert whole.p95 == ordered[math.ceil(0.95 * count) - 1]


def test_a_window_merges_exact_and_digest_sketches_within_percentile_approx_accuracy(
    spark: Any,
) -> None:
    # The first pane has 3,000 distinct values (a digest), the next two repeat 11 (exact).
    first = [float((i * 7_919) % 3_000) / 100 for i in range(3_000)]
    rest = [float(i % 11) for i in range(6_000)]
    events = [sensor("t-5", T0 + timedelta(seconds=i * 60 / 3_000), v) for i, v in enumerate(first)]
    events += [
        sensor("t-5", T0 + timedelta(seconds=60 + i * 120 / 6_000), v) for i, v in enumerate(rest)
    ]

    rows = aggregate(frame(spark, events), [WindowSpec(180, 60)], 0)
    whole = {r.window_start.astimezone(UTC): r for r in rows.collect()}[T0]

    ordered = sorted(first + rest)
    for fraction, got in ((0.5, whole.p50), (0.95, whole.p95)):
        rank = math.ceil(fraction * len(ordered)) - 1
        slack = math.ceil(len(ordered) / 10_000) + 1
        assert ordered[max(0, rank - slack)] <= got <= ordered[rank + slack], (fraction, got)


def test_a_digest_in_a_checkpoint_from_before_exact_sketches_still_merges(spark: Any) -> None:
    # State written before the exact form holds percentile_approx's digest bytes.
    aggregates = spark.sparkContext._jvm.org.apache.spark.sql.catalyst.expressions.aggregate
    digest = getattr(aggregates, "ApproximatePercentile$PercentileDigest")(1.0 / 10_000)
    for value in range(1, 101):
        digest.add(float(value))
    old = bytes(aggregates.ApproximatePercentile.serializer().serialize(digest))
    events = [sensor("t-5", T0 + timedelta(seconds=s), 1_000.0) for s in range(100)]
    new = summarise_panes(frame(spark, events), 60).select("sketch").collect()
    sketches = spark.createDataFrame([(old,)] + [(r.sketch,) for r in new], "sketch binary")

    [merged] = (
        sketches.select(F.expr(f"{MERGE_SKETCHES}(sketch)").alias("s"))
        .select(
            F.call_udf(SKETCH_PERCENTILE, "s", F.lit(0.25)).alias("p25"),
            F.call_udf(SKETCH_PERCENTILE, "s", F.lit(0.75)).alias("p75"),
        )
        .collect()
    )
    # 1..100 and 100 readings of 1,000: the 50th and the 150th of 200.
    assert (merged.p25, merged.p75) == (50.0, 1_000.0)


def test_sources_are_each_partitions_offsets_of_exactly_the_events_counted(spark: Any) -> None:
    # t-6's events come from partitions 3 and 1 (a repartition); t-7's lie between them.
    seconds = [1, 20, 61, 62, 125, 130, 170]
    partitions = [3, 1, 3, 1, 1, 3, 3]
    events = [sensor("t-6", T0 + timedelta(seconds=s), float(s)) for s in seconds]
    events.insert(3, sensor("t-7", T0 + timedelta(seconds=30), 0.0))
    partitions.insert(3, 3)
    specs = [WindowSpec(60, 60), WindowSpec(120, 60)]

    rows = aggregate(frame(spark, events, partitions), specs, 0).collect()
    got = {
        (r.window, r.window_start.astimezone(UTC)): ([s.asDict() for s in r.sources], r["count"])
        for r in rows
        if r.entity_id == "t-6"
    }

    minute = timedelta(minutes=1)
    # Offsets per partition, in publishing order: p3 100 (1 s), 101 (61 s), 102 (t-7),
    # 103 (130 s), 104 (170 s); p1 100 (20 s), 101 (62 s), 102 (125 s).
    assert got == {
        ("tumbling-60s", T0): ([source(1, 100, 100, 1), source(3, 100, 100, 1)], 2),
        ("tumbling-60s", T0 + minute): ([source(1, 101, 101, 1), source(3, 101, 101, 1)], 2),
        ("tumbling-60s", T0 + 2 * minute): ([source(1, 102, 102, 1), source(3, 103, 104, 2)], 3),
        ("sliding-120s-every-60s", T0 - minute): (
            [source(1, 100, 100, 1), source(3, 100, 100, 1)],
            2,
        ),
        ("sliding-120s-every-60s", T0): ([source(1, 100, 101, 2), source(3, 100, 101, 2)], 4),
        # t-7's event lies inside p3's range, outside its count.
        ("sliding-120s-every-60s", T0 + minute): (
            [source(1, 101, 102, 2), source(3, 101, 104, 3)],
            5,
        ),
        ("sliding-120s-every-60s", T0 + 2 * minute): (
            [source(1, 102, 102, 1), source(3, 103, 104, 2)],
            3,
        ),
    }


def test_web_requests_give_latency_and_error_rate_per_host_and_path(spark: Any) -> None:
    values = [
        web("web-1", T0 + timedelta(seconds=1), "/a", 200, 10.0),
        web("web-1", T0 + timedelta(seconds=2), "/a", 503, 30.0),
        web("web-1", T0 + timedelta(seconds=3), "/a", 500, 20.0),
        web("web-1", T0 + timedelta(seconds=4), "/b", 200, 5.0),
    ]

    rows = aggregate(frame(spark, values), [WindowSpec(60, 60)], 30)
    by_path = {r.path: r for r in rows.collect()}

    a = by_path["/a"]
    assert (a.metric, a.unit, a["count"], a.max) == (WEB_LATENCY, "ms", 3, 30.0)
    assert abs(a.error_rate - 2 / 3) < 1e-9
    assert by_path["/b"].error_rate == 0.0


def test_the_series_lineage_matches_events_by_are_the_ones_the_windows_read(spark: Any) -> None:
    """``shared.feature_store.event_series`` (Python, for the lineage walk),
    ``observations`` (Spark SQL) and the windows' pane summaries give each
    event the same series."""
    two = events_pb2.CleanEvent(event_id="two", entity_id="s-2")
    two.event_time.FromDatetime(T0)
    two.sensor_reading.device_id = "s-2"
    two.sensor_reading.measurements.add(metric="temperature", value=1.0, unit="degC")
    two.sensor_reading.measurements.add(metric="humidity", value=40.0, unit="%")
    events = [
        events_pb2.CleanEvent.FromString(sensor("s-1", T0, 5.0)),
        two,
        events_pb2.CleanEvent.FromString(web("w-1", T0, "/a", 200, 3.0)),
        events_pb2.CleanEvent.FromString(web("w-1", T0, "/b", 500, 4.0)),
    ]
    values = [event.SerializeToString() for event in events]
    rows = observations(decode(frame(spark, values))).collect()
    read = sorted((r.offset, r.entity_id, r.metric, r.path) for r in rows)
    expected = sorted(
        (100 + i, *series) for i, event in enumerate(events) for series in event_series(event)
    )
    assert read == expected
    assert len(expected) == 5
    summaries = summarise_panes(frame(spark, values), 60).collect()
    summarised = sorted(
        (s.sources.ranges[0].minOffset, s.entity_id, s.metric, s.path) for s in summaries
    )
    assert summarised == expected


def test_aggregates_encode_as_feature_windows(spark: Any) -> None:
    values = [web("web-1", T0, "/a", 503, 10.0), sensor("t-3", T0, 5.0)]
    rows = aggregate(frame(spark, values), [WindowSpec(60, 60)], 30)

    encoded = [bytes(r.v) for r in rows.select(feature_window_bytes().alias("v")).collect()]

    windows = {w.entity_id: w for w in map(features_pb2.FeatureWindow.FromString, encoded)}
    assert dict(windows["web-1"].dimensions) == {"path": "/a"}
    assert windows["web-1"].error_rate == 1.0 and windows["web-1"].count == 1
    assert dict(windows["t-3"].dimensions) == {} and windows["t-3"].mean == 5.0
    assert windows["t-3"].window_size.seconds == 60
    # The events sat at offsets 100 and 101 of partition 0.
    assert [
        (s.topic, s.partition, s.min_offset, s.max_offset, s.count)
        for s in windows["web-1"].sources
    ] == [(CLEAN, 0, 100, 100, 1)]
    assert [(s.min_offset, s.count) for s in windows["t-3"].sources] == [(101, 1)]


def test_running_windows_read_as_the_closed_windows_do(spark: Any) -> None:
    # Two specs, uneven panes, a web request and a second partition: the
    # open-window query's single aggregation gives aggregate()'s rows.
    values = [sensor("t-4", T0 + timedelta(seconds=s), float(s % 17)) for s in range(0, 170, 7)]
    values += [web("web-2", T0 + timedelta(seconds=30), "/a", 200, 12.5)]
    partitions = [i % 2 for i in range(len(values))]
    specs = [WindowSpec(60, 60), WindowSpec(120, 60)]
    records = frame(spark, values, partitions)

    def rows(windows: Any) -> dict[str, dict[str, Any]]:
        return {r.window_key: r.asDict(recursive=True) for r in windows.collect()}

    closed, running = rows(aggregate(records, specs, 0)), rows(running_windows(records, specs, 0))
    assert closed.keys() == running.keys() and len(closed) == 10
    for key, row in closed.items():
        assert running[key].keys() == row.keys()
        for column, value in row.items():
            if isinstance(value, float):
                assert abs(running[key][column] - value) < 1e-9, (key, column)
            else:
                assert running[key][column] == value, (key, column)


def test_an_open_window_encodes_as_one(spark: Any) -> None:
    rows = running_windows(frame(spark, [sensor("t-5", T0, 5.0)]), [WindowSpec(60, 60)], 30)
    (encoded,) = [
        features_pb2.FeatureWindow.FromString(bytes(r.v))
        for r in rows.select(feature_window_bytes(open_window=True).alias("v")).collect()
    ]
    assert encoded.open and (encoded.entity_id, encoded.count) == ("t-5", 1)
    closed = aggregate(frame(spark, [sensor("t-5", T0, 5.0)]), [WindowSpec(60, 60)], 30)
    (encoded,) = [
        features_pb2.FeatureWindow.FromString(bytes(r.v))
        for r in closed.select(feature_window_bytes().alias("v")).collect()
    ]
    assert not encoded.open


def test_a_batch_written_from_the_driver_reads_back_as_sparks_own_write(
    spark: Any, tmp_path: Path
) -> None:
    """``WindowSink.to_parquet_collected`` (pyarrow, from the driver's
    collect) against ``to_parquet`` (Spark's write) of the same batch: the
    same directories, files Spark and pyarrow read alike, and a batch written
    again replacing its own partitions only."""
    odd = events_pb2.CleanEvent(event_id="odd", entity_id="t-6")
    odd.event_time.FromDatetime(T0 + timedelta(seconds=3))
    odd.sensor_reading.device_id = "t-6"
    # Characters Spark escapes in a directory name.
    odd.sensor_reading.measurements.add(metric="in/out:a=b %#?", value=2.5, unit="degC")
    values = [sensor(f"t-{i % 3}", T0 + timedelta(seconds=7 * i), float(i)) for i in range(30)]
    values += [odd.SerializeToString(), web("web-3", T0, "/a b", 500, 4.0)]
    specs = [WindowSpec(60, 60), WindowSpec(120, 60)]
    batch = aggregate(frame(spark, values), specs, 0).cache()

    def sink(root: Path) -> WindowSink:
        return WindowSink(
            kafka=KafkaSettings(),
            redis=RedisSettings(),
            features_topic="unused",
            offline_path=str(root),
            online_key_prefix="unused",
            online_ttl_seconds=60,
        )

    by_spark, by_driver = sink(tmp_path / "spark"), sink(tmp_path / "driver")
    by_spark.to_parquet(batch, 5)
    by_driver.to_parquet_collected(batch, by_driver.collect(batch), 5)

    def leaves(root: Path) -> dict[str, list[Path]]:
        files: dict[str, list[Path]] = {}
        for file in sorted(root.rglob("*.parquet")):
            files.setdefault(str(file.parent.relative_to(root)), []).append(file)
        return files

    def footer(schema: Any) -> dict[bytes, Any]:
        """The file's key-value metadata, Spark's schema parsed."""
        meta = dict(schema.metadata or {})
        meta[SPARK_SCHEMA_KEY.encode()] = json.loads(meta[SPARK_SCHEMA_KEY.encode()])
        return meta

    spark_files, driver_files = leaves(tmp_path / "spark"), leaves(tmp_path / "driver")
    assert spark_files.keys() == driver_files.keys()
    assert "metric=in%2Fout%3Aa%3Db %25%23%3F" in {
        part for name in driver_files for part in name.split("/")
    }
    assert {len(files) for files in driver_files.values()} == {1}
    for name, (file, *_) in spark_files.items():
        ours = pq.read_schema(driver_files[name][0])
        theirs = pq.read_schema(file)
        assert ours.remove_metadata() == theirs.remove_metadata(), name
        assert footer(ours) == footer(theirs), name

    def stored(root: Path) -> tuple[Any, list[str]]:
        frame = spark.read.parquet(str(root))
        return frame.schema, sorted(str(row) for row in frame.collect())

    assert stored(tmp_path / "driver") == stored(tmp_path / "spark")
    assert len(stored(tmp_path / "driver")[1]) == batch.count() > 10

    # Batch 5 again, fewer temperature windows: the partitions it writes
    # hold only those, the other metrics' partitions of batch 5 are kept;
    # then batch 6, beside it.
    fewer = batch.where("entity_id = 't-0'")
    by_driver.to_parquet_collected(fewer, by_driver.collect(fewer), 5)
    by_driver.to_parquet_collected(batch, by_driver.collect(batch), 6)
    again = spark.read.parquet(str(tmp_path / "driver"))
    temperature = "metric = 'temperature'"
    assert again.where(f"batch = 5 AND {temperature}").count() == fewer.count() > 0
    others = batch.where(f"NOT {temperature}").count()
    assert again.where(f"batch = 5 AND NOT {temperature}").count() == others > 0
    assert again.where("batch = 6").count() == batch.count()
    assert not [p for p in (tmp_path / "driver").iterdir() if p.name.startswith(".")]
