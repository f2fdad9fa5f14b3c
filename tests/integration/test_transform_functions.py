"""svc_transform's JVM protobuf functions, and its driver's local
filesystem, checkpoint files and progress reports, on a real local Spark."""

from __future__ import annotations

import os
import stat
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import CollectorRegistry
from pyspark.sql import functions as F

from shared.contracts.aistack.v1 import common_pb2, events_pb2, features_pb2
from shared.feature_store import WEB_LATENCY
from shared.object_store import CHECKPOINT_MANAGER_CONF, checkpoint_options
from svc_transform.codegen import (
    CODEGEN_FACTORY_MODE,
    GENERATED,
    INTERPRETED,
    BatchSizes,
    ByBatchSize,
)
from svc_transform.functions import (
    CLEAN_EVENT_ERROR,
    DECODE_OBSERVATIONS,
    ENCODE_DEAD_LETTER,
    ENCODE_FEATURE_WINDOW,
)
from svc_transform.jars import NIO_LOCAL_FILESYSTEM
from svc_transform.job import ProgressListener
from svc_transform.metrics import TransformMetrics


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


def test_clean_events_decode_to_their_observations_in_the_jvm(spark: Any) -> None:
    frame = spark.createDataFrame(
        [(_sensor_event(),), (_web_event(),), (b"\xff\x00 not protobuf",), (None,)], ["value"]
    )
    rows = frame.selectExpr(f"{DECODE_OBSERVATIONS}(value) AS observed").collect()

    sensor, web, garbage, empty = (row.observed for row in rows)
    at = datetime(2026, 11, 22, 10, 0, 5, 250_000, UTC)
    assert [(o.entity_id, o.event_time.astimezone(UTC)) for o in sensor] == [("thermo-7", at)] * 2
    assert [(o.metric, o.path, o.unit, o.value, o.is_error) for o in sensor] == [
        ("temperature", "", "degC", 21.5, None),
        ("humidity", "", "%", 40.0, None),
    ]
    # A web request's latency, on its path; a status of 500 or more is an error.
    assert [(o.entity_id, o.metric, o.path, o.unit, o.value, o.is_error) for o in web] == [
        ("web-1", WEB_LATENCY, "/api/orders", "ms", 12.5, 1.0)
    ]
    assert web[0].event_time.astimezone(UTC) == datetime(2026, 11, 22, 10, 0, 6, tzinfo=UTC)
    # What does not decode gives nothing: the dead-letter query says why.
    assert garbage == [] and empty == []


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
        f"{CLEAN_EVENT_ERROR}(value) AS error", f"size({DECODE_OBSERVATIONS}(value)) AS observed"
    ).collect()

    # The decoder gives observations exactly where the error is null.
    assert [r.error is None for r in rows] == [r.observed > 0 for r in rows]
    assert [r.error for r in rows][:2] == [None, None]
    assert [r.error for r in rows][3:] == [
        "record has no value",
        "CleanEvent has no entity_id",
        "CleanEvent has neither a sensor reading nor a web request",
    ]
    assert rows[2].error.startswith("not an aistack.v1.CleanEvent")


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field in protobuf's wire format."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_what_the_wire_format_forbids_is_dead_lettered_wherever_it_hides(spark: Any) -> None:
    # Each appended field merges into the event: only it is wrong, and some
    # lie in fields the windows never read.
    broken = [
        _sensor_event() + _field(2, b"\xff\xfe"),  # entity_id not UTF-8
        _sensor_event() + _field(10, _field(2, _field(1, b"\xc3\x28"))),  # a metric's name
        _sensor_event() + _field(5, _field(1, b"\xff") + _field(2, b"v")),  # an attribute's key
        _web_event() + _field(11, _field(9, b"\xff")),  # the request's user agent
        _sensor_event() + _field(4, b"\x08"),  # ingest_time cut inside a field
    ]
    # A field this version does not know is a later version's, not an error.
    newer = _sensor_event() + _field(99, b"from a later contract")
    frame = spark.createDataFrame([(v,) for v in [*broken, newer]], ["value"])

    rows = frame.selectExpr(
        f"{CLEAN_EVENT_ERROR}(value) AS error", f"{DECODE_OBSERVATIONS}(value) AS observed"
    ).collect()

    for row in rows[:-1]:
        assert row.error is not None and row.error.startswith("not an aistack.v1.CleanEvent")
        assert row.observed == []
    assert rows[-1].error is None
    assert [o.entity_id for o in rows[-1].observed] == ["thermo-7", "thermo-7"]


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


def _hadoop_path(spark: Any, path: Path) -> Any:
    return spark._jvm.org.apache.hadoop.fs.Path(path.as_uri())


def _local_filesystem(spark: Any, path: Path) -> Any:
    return _hadoop_path(spark, path).getFileSystem(spark._jsc.hadoopConfiguration())


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_local_files_get_their_permissions_through_java_nio(spark: Any, tmp_path: Path) -> None:
    filesystem = _local_filesystem(spark, tmp_path)
    assert filesystem.getClass().getName() == NIO_LOCAL_FILESYSTEM
    jvm = spark._jvm
    permission = jvm.org.apache.hadoop.fs.permission.FsPermission

    # A created file gets Hadoop's default, 666 less its umask (022).
    created = tmp_path / "made" / "file.bin"
    stream = filesystem.create(_hadoop_path(spark, created))
    stream.write(b"written")
    stream.close()
    assert created.read_bytes() == b"written"
    assert _mode(created) == 0o644

    directory = tmp_path / "dir" / "below"
    assert filesystem.mkdirs(_hadoop_path(spark, directory), permission("750"))
    assert _mode(directory) == 0o750
    filesystem.setPermission(_hadoop_path(spark, created), permission("604"))
    assert _mode(created) == 0o604
    # Bits beyond rwx (the sticky bit) are Hadoop's own chmod's.
    filesystem.setPermission(_hadoop_path(spark, directory), permission("1777"))
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o1777


def test_local_link_status_is_hadoops(spark: Any, tmp_path: Path) -> None:
    """Without a process: the same status as Hadoop's own local filesystem
    gives, for a link, a file and a path that is not there."""
    jvm = spark._jvm
    ours = _local_filesystem(spark, tmp_path)
    hadoops = jvm.org.apache.hadoop.fs.LocalFileSystem()
    hadoops.initialize(jvm.java.net.URI("file:///"), spark._jsc.hadoopConfiguration())
    target = tmp_path / "target.txt"
    target.write_text("twelve bytes")
    link = tmp_path / "link.txt"
    link.symlink_to(target)

    for path in (target, link):
        mine = ours.getFileLinkStatus(_hadoop_path(spark, path))
        theirs = hadoops.getFileLinkStatus(_hadoop_path(spark, path))
        assert (mine.isSymlink(), mine.isFile(), mine.getLen(), mine.getPath().toString()) == (
            theirs.isSymlink(),
            theirs.isFile(),
            theirs.getLen(),
            theirs.getPath().toString(),
        )
        assert mine.getLen() == 12
    for filesystem in (ours, hadoops):
        with pytest.raises(Exception, match="FileNotFoundException"):
            filesystem.getFileLinkStatus(_hadoop_path(spark, tmp_path / "missing"))


def test_a_local_checkpoint_file_is_written_whole_and_replaced(spark: Any, tmp_path: Path) -> None:
    """The checkpoint manager a local checkpoint gets (``checkpoint_options``),
    on the local filesystem the session names: a file appears only when
    closed, and an existing one is replaced only when asked."""
    jvm = spark._jvm
    (manager_class,) = checkpoint_options(str(tmp_path)).values()
    conf = spark._jsc.hadoopConfiguration()
    managers = jvm.org.apache.spark.sql.execution.streaming.CheckpointFileManager
    conf.set(CHECKPOINT_MANAGER_CONF, manager_class)
    try:
        files = managers.create(_hadoop_path(spark, tmp_path), conf)
    finally:
        conf.unset(CHECKPOINT_MANAGER_CONF)
    assert files.getClass().getName() == manager_class
    batch = tmp_path / "offsets" / "0"
    files.mkdirs(_hadoop_path(spark, batch.parent))
    stream = files.createAtomic(_hadoop_path(spark, batch), False)
    stream.write(b"v1")
    assert not batch.exists()
    stream.close()
    assert batch.read_bytes() == b"v1"
    again = files.createAtomic(_hadoop_path(spark, batch), False)
    again.write(b"v2")
    with pytest.raises(Exception, match="FileAlreadyExists"):
        again.close()
    assert batch.read_bytes() == b"v1"
    replaced = files.createAtomic(_hadoop_path(spark, batch), True)
    replaced.write(b"v3")
    replaced.close()
    assert batch.read_bytes() == b"v3"


class _Recorded(ProgressListener):
    def __init__(self, registry: CollectorRegistry, sizes: BatchSizes) -> None:
        super().__init__(TransformMetrics.create(registry), sizes)
        self.progress: list[Any] = []

    def onQueryProgress(self, event: Any) -> None:
        # Recorded once the metrics count it: a test that sees the report
        # reads its counts.
        super().onQueryProgress(event)
        self.progress.append(event.progress)


def test_progress_reports_reach_the_listener_as_json_and_size_the_next_batch(
    spark: Any,
) -> None:
    registry = CollectorRegistry()
    sizes = BatchSizes()
    listener = _Recorded(registry, sizes)
    spark.streams.addListener(listener)
    modes: list[tuple[int, str, int]] = []  # batch, its projections, windows counted

    def sink(batch: Any, batch_id: int) -> None:
        counted = batch.agg(F.sum("count")).first()[0] or 0
        modes.append((batch_id, batch.sparkSession.conf.get(CODEGEN_FACTORY_MODE), counted))

    windows = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 200)
        .load()
        .withWatermark("timestamp", "1 second")
        .groupBy(F.window("timestamp", "1 second"))
        .count()
    )
    name = "progress_as_json"
    query = (
        windows.writeStream.queryName(name)
        .outputMode("update")
        .foreachBatch(ByBatchSize(sink, name, sizes, interpreted_max_rows=20_000))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while not any(mode == INTERPRETED and rows for _, mode, rows in modes):
            assert time.monotonic() < deadline, f"no small batch ran interpreted: {modes}"
            time.sleep(0.2)
        # Its report reaches the listener after the batch, on Spark's bus.
        interpreted = next(b for b, mode, rows in modes if mode == INTERPRETED and rows)
        while not any(p.batchId >= interpreted for p in listener.progress if p.name == name):
            assert time.monotonic() < deadline, f"batch {interpreted} was never reported"
            time.sleep(0.2)
    finally:
        query.stop()
        spark.streams.removeListener(listener)
    reports = [p for p in listener.progress if p.name == name]
    # Read as one JSON document each: nothing held on the JVM.
    assert all(p._jprogress is None for p in reports)
    assert [p.batchId for p in reports] == sorted({p.batchId for p in reports})
    assert str(reports[0].id) == query.id
    assert reports[-1].stateOperators[0].numRowsTotal >= 0
    counted = registry.get_sample_value("aistack_transform_rows_in_total", {"query": name})
    assert counted == sum(p.numInputRows for p in reports) > 0
    # Before its first report, a query may be reading a backlog: generated code.
    assert modes[0][1] == GENERATED
    # Each batch's running counts add up to its rows, whichever projections ran.
    by_batch = {p.batchId: p.numInputRows for p in reports}
    for batch_id, _, windows_counted in modes:
        if batch_id in by_batch and windows_counted:
            assert windows_counted >= by_batch[batch_id]
