"""svc_transform with its checkpoints and offline store on the object store:
real Kafka, Spark and S3Proxy (S3A writes ``s3a://``, the offline store's
reader reads the same objects as ``s3://``), the job as its own process."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import features_pb2
from shared.feature_store import OFFLINE_COLUMNS, online_field
from shared.object_store import filesystem
from shared.offline_store import latest_windows, open_store, selection, training_distribution
from svc_transform.job import SINGLE_QUERY_CHECKPOINT
from svc_transform.sinks import WindowSink
from tests.infra import Infra, read_records, read_topic, wait_until
from tests.integration import test_transform_job as transform_tests
from tests.integration.test_transform_job import QUERY, T0, publish, reading
from tests.integration.transform_job import TransformJob, TransformTopics
from tests.object_store import LocalObjectStore

pytestmark = pytest.mark.timeout(300)

TUMBLING = "tumbling-10s"


# The job's own topics and a producer onto them, as the job's tests make them.
topics = transform_tests.topics
producer = transform_tests.producer


def on_the_store(
    infra: Infra,
    topics: TransformTopics,
    store: LocalObjectStore,
    state: Path,
    prefix: str,
) -> TransformJob:
    """The job with its checkpoint and offline store under ``prefix`` in the
    bucket, named as Spark names them (``s3a://``)."""
    return TransformJob(
        infra,
        topics,
        state,
        AISTACK_TRANSFORM_CHECKPOINT_DIR=store.url(f"{prefix}/checkpoint", "s3a"),
        AISTACK_TRANSFORM_OFFLINE_DIR=store.url(f"{prefix}/windows", "s3a"),
        AISTACK_TRANSFORM_OPEN_WINDOWS="none",
        **store.env(),
    )


def stored_rows(store: LocalObjectStore, prefix: str, entity: str) -> list[dict[str, Any]]:
    """Every row of ``entity`` in the offline store, read as ``s3://``."""
    dataset = open_store(store.url(f"{prefix}/windows"), store.settings)
    table = dataset.to_table(filter=selection("temperature", TUMBLING))
    return [row for row in table.to_pylist() if row["entity_id"] == entity]


def test_windows_written_on_s3a_are_read_back_from_s3(
    infra: Infra,
    topics: TransformTopics,
    producer: BusProducer,
    object_store: LocalObjectStore,
    tmp_path: Path,
    unique: str,
) -> None:
    job = on_the_store(infra, topics, object_store, tmp_path / "job", unique)
    try:
        readings = [(1, 20.0), (5, 27.0), (7, 22.0), (12, 30.0)]
        publish(producer, topics.clean, [reading("t-s", s, v) for s, v in readings])
        publish(producer, topics.clean, [reading("clock", 40, 0.0)])  # closes both windows
        windows = read_records(infra.kafka, topics.features, wanted=2, timeout=180)
        assert len(windows) == 2, job.log_text()[-3000:]
        assert job.terminate() == 0
    finally:
        job.close()

    rows = stored_rows(object_store, unique, "t-s")
    by_start = {row["window_start"].astimezone(UTC): row for row in rows}
    assert sorted(by_start) == [T0, T0 + timedelta(seconds=10)]
    assert (by_start[T0]["count"], by_start[T0]["min"], by_start[T0]["max"]) == (3, 20.0, 27.0)
    assert by_start[T0 + timedelta(seconds=10)]["mean"] == 30.0
    # What the trainer and the model registry read: the same windows by URL.
    reference = training_distribution(
        object_store.url(f"{unique}/windows"),
        f"temperature@{TUMBLING}",
        settings=object_store.settings,
    )
    assert reference.feature == online_field("temperature", TUMBLING)
    # The checkpoint is on the bucket too, and nothing was left on local disk.
    fs, root = filesystem(object_store.url(unique), object_store.settings)
    assert fs.exists(f"{root}/checkpoint/{SINGLE_QUERY_CHECKPOINT}/offsets/0")
    assert not (tmp_path / "job" / "transform" / "checkpoint").exists()
    assert not (tmp_path / "job" / "features").exists()


def test_a_job_restarted_from_its_checkpoint_on_the_bucket_counts_each_window_once(
    infra: Infra,
    topics: TransformTopics,
    producer: BusProducer,
    object_store: LocalObjectStore,
    tmp_path: Path,
    unique: str,
) -> None:
    # One reading a second for 100 s: 10 windows of 10 readings, values 0..99.
    events = [reading("t-r", s, float(s)) for s in range(100)]
    state = tmp_path / "job"
    job = on_the_store(infra, topics, object_store, state, unique)
    try:
        publish(producer, topics.clean, events[:50])  # closes the first 4 windows
        wait_until(
            lambda: job.counter("transform_windows_out_total", QUERY) >= 2,
            180,
            "no window was written before the kill",
        )
        job.kill()
    finally:
        job.close()
    publish(producer, topics.clean, [*events[50:], reading("clock", 160, 0.0)])

    restarted = on_the_store(infra, topics, object_store, state, unique)
    try:
        wait_until(lambda: len(window_keys(infra, topics)) >= 10, 180, "windows are missing")
        assert restarted.terminate() == 0
    finally:
        restarted.close()

    rows = stored_rows(object_store, unique, "t-r")
    starts = sorted(row["window_start"].astimezone(UTC) for row in rows)
    assert starts == [T0 + timedelta(seconds=10 * i) for i in range(10)]  # none missing or twice
    assert sorted((row["count"], row["min"]) for row in rows) == [
        (10, float(10 * i)) for i in range(10)
    ]
    # The reader's view (the latest batch of each window) is the same ten windows.
    dataset = open_store(object_store.url(f"{unique}/windows"), object_store.settings)
    latest = latest_windows(dataset, selection("temperature", TUMBLING), "test", (None, None))
    assert len(latest.start_us) == 10  # the clock's own window is still open


def window_keys(infra: Infra, topics: TransformTopics) -> set[str]:
    values = read_topic(infra.kafka, topics.features, wanted=10_000, timeout=3)
    windows = map(features_pb2.FeatureWindow.FromString, values)
    return {w.window_key for w in windows if w.entity_id == "t-r"}


@pytest.fixture(scope="module")
def store_spark(
    object_store: LocalObjectStore, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """This module's own Spark, on the object store (the shared ``spark``
    fixture's is not)."""
    from shared.settings import CommonSettings, SparkSettings
    from svc_transform.spark import session

    started = session(
        SparkSettings(master="local[2]"),
        "aistack-tests-object-store",
        cache_dir=CommonSettings().cache_dir,
        work_dir=tmp_path_factory.mktemp("spark-driver"),
        class_archive=False,
        object_store=object_store.settings,
    )
    yield started
    started.stop()


def test_a_batch_written_again_replaces_its_own_partitions_on_the_bucket(
    infra: Infra, object_store: LocalObjectStore, store_spark: Any, unique: str
) -> None:
    """What a batch that Spark runs again after a restart does to the store."""
    frame = store_spark.createDataFrame(
        [("k", "e", "2026-11-22", "temperature", TUMBLING, 3.0)],
        "window_key string, entity_id string, date string, metric string, window string, "
        "mean double",
    )
    # The other columns, empty: only the partitions matter here.
    columns = {n: F.lit(None).cast("string") for n in OFFLINE_COLUMNS if n not in frame.columns}
    frame = frame.withColumns(columns).withColumn("window_start", F.lit(T0))
    root = object_store.url(f"{unique}/windows", "s3a")

    def sink() -> WindowSink:
        return WindowSink(
            kafka=infra.kafka,
            redis=infra.redis,
            features_topic="unused",
            offline_path=root,
            online_key_prefix="unused",
            online_ttl_seconds=60,
        )

    sink().to_parquet(frame, 7)
    sink().to_parquet(frame.withColumn("mean", F.lit(4.0)), 8)
    restarted = sink()  # batch 8 again, after a restart: replaces its own rows only
    restarted.to_parquet(frame.withColumn("mean", F.lit(5.0)), 8)
    restarted.to_parquet(frame.withColumn("mean", F.lit(6.0)), 9)
    table = open_store(object_store.url(f"{unique}/windows"), object_store.settings).to_table()
    assert sorted(zip(table["batch"].to_pylist(), table["mean"].to_pylist(), strict=True)) == [
        (7, 3.0),
        (8, 5.0),
        (9, 6.0),
    ]
