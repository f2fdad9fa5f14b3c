"""svc_transform end to end: real Kafka, Spark and Redis, the job as its own process."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka.partitioner import murmur2
from confluent_kafka import Producer

from shared.bus.envelope import PROTOBUF_CONTENT_TYPE, parse_headers
from shared.bus.producer import BusProducer
from shared.bus.topics import partition_count
from shared.contracts.aistack.v1 import events_pb2, features_pb2
from shared.feature_store import decode_window, online_field, online_key, open_field
from shared.redis_client import make_redis
from tests.infra import Infra, read_records, read_topic, wait_until
from tests.integration.transform_job import (
    TransformJob,
    TransformTopics,
    clean_positions,
    expected_sources,
    ranges,
)

pytestmark = pytest.mark.timeout(300)

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
QUERY = '{query="windows"}'


def reading(entity: str, seconds: float, value: float) -> events_pb2.CleanEvent:
    event = events_pb2.CleanEvent(event_id=f"{entity}-{seconds}", entity_id=entity)
    event.event_time.FromDatetime(T0 + timedelta(seconds=seconds))
    event.sensor_reading.device_id = entity
    event.sensor_reading.measurements.add(metric="temperature", value=value, unit="degC")
    return event


@pytest.fixture
def topics(infra: Infra, unique: str) -> TransformTopics:
    created = TransformTopics.unique(unique)
    created.create(infra.kafka)
    return created


@pytest.fixture
def producer(infra: Infra) -> Iterator[BusProducer]:
    made = BusProducer(infra.kafka, source="tests")
    yield made
    made.flush()


def publish(
    producer: BusProducer,
    topic: str,
    events: list[events_pb2.CleanEvent],
    partition: int | None = None,
) -> None:
    for event in events:
        producer.publish(topic, event, key=event.entity_id, partition=partition)
    producer.flush()


#: The job's shapes (AISTACK_TRANSFORM_QUERIES): a query each for the closed
#: windows, the open ones and the dead letters, or one for all three.
QUERIES = pytest.mark.parametrize("queries", ["three", "one"], ids=["three-queries", "one-query"])


@pytest.mark.parametrize(
    ("driver_max_windows", "queries"),
    # The default: a batch's few windows written by the driver; 0: every
    # batch by Spark's Kafka sink and its executors, as a large one is (and,
    # with one query, each kind by its own jobs, as after a large batch).
    [("20000", "three"), ("0", "three"), ("20000", "one"), ("0", "one")],
    ids=["driver-writes", "spark-writes", "one-query", "one-query-spark-writes"],
)
def test_windows_reach_kafka_parquet_and_redis_exactly_and_late_data_is_counted(
    infra: Infra,
    topics: TransformTopics,
    producer: BusProducer,
    tmp_path: Path,
    spark: Any,
    driver_max_windows: str,
    queries: str,
) -> None:
    job = TransformJob(
        infra,
        topics,
        tmp_path / "job",
        AISTACK_TRANSFORM_SLIDING_WINDOW_SECONDS="20",
        AISTACK_TRANSFORM_SLIDING_SLIDE_SECONDS="10",
        AISTACK_TRANSFORM_DRIVER_WRITE_MAX_WINDOWS=driver_max_windows,
        AISTACK_TRANSFORM_QUERIES=queries,
    )
    try:
        # What a killed svc_ingest left behind: a transaction that was
        # aborted. Its reading is on the topic and must count nowhere.
        aborted = Producer(
            {**infra.kafka.client_config(), "transactional.id": f"{topics.clean}-aborted"}
        )
        aborted.init_transactions(30)
        aborted.begin_transaction()
        aborted.produce(
            topics.clean, reading("t-1", 2, 1000.0).SerializeToString(), key=b"t-1", partition=0
        )
        aborted.flush(30)
        aborted.abort_transaction(30)
        first = [(7, 22.0), (1, 20.0), (5, 27.0)]  # out of order, inside the watermark
        publish(producer, topics.clean, [reading("t-1", s, v) for s, v in first], partition=0)
        # From another partition (as after a repartition): one sliding window holds both.
        publish(producer, topics.clean, [reading("t-1", 12, 30.0)], partition=1)
        producer.publish_raw(topics.clean, b"\x00 not a CleanEvent", key=b"t-1")
        # The clock: pushes the watermark to T0+35 s, closing both windows of t-1.
        publish(producer, topics.clean, [reading("clock", 40, 0.0)])

        # t-1: two tumbling windows, and three 20 s windows sliding every 10 s.
        kept = read_records(infra.kafka, topics.features, wanted=5, timeout=180)
        records = [record.value() for record in kept]
        windows = [features_pb2.FeatureWindow.FromString(v) for v in records]
        assert len(windows) == 5, job.log_text()[-3000:]
        # Either way, a record as every aistack producer writes one: keyed by
        # the entity on the partition Kafka's Java partitioner gives the key
        # (where Spark's sink puts it), the envelope's id the window's key.
        partitions = partition_count(infra.kafka, topics.features)
        for record, window in zip(kept, windows, strict=True):
            assert record.key() == window.entity_id.encode()
            assert record.partition() == (murmur2(record.key()) & 0x7FFFFFFF) % partitions
            headed = parse_headers(record.headers())
            assert (headed.message_type, headed.event_id, headed.source) == (
                "aistack.v1.FeatureWindow",
                window.window_key,
                "svc_transform",
            )
            assert headed.content_type == PROTOBUF_CONTENT_TYPE
            assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", headed.traceparent)
        by_start = {
            w.window_start.ToDatetime(tzinfo=UTC): w for w in windows if w.window_size.seconds == 10
        }
        sliding = {
            w.window_start.ToDatetime(tzinfo=UTC): w.count
            for w in windows
            if (w.window_size.seconds, w.window_slide.seconds) == (20, 10)
        }
        assert sliding == {T0 - timedelta(seconds=10): 3, T0: 4, T0 + timedelta(seconds=10): 1}
        values = [v for _, v in first]
        w = by_start[T0]
        assert (w.entity_id, w.metric, w.unit, w.count) == ("t-1", "temperature", "degC", 3)
        assert (w.min, w.max, w.last) == (20.0, 27.0, 22.0)  # last by event time
        assert w.mean == pytest.approx(statistics.mean(values))
        assert w.stddev == pytest.approx(statistics.stdev(values))
        assert w.window_size.seconds == 10
        assert by_start[T0 + timedelta(seconds=10)].count == 1
        # Each window names the clean events it counted, per partition.
        positions = clean_positions(infra.kafka, topics.clean, wanted=5)
        ids = {s: f"t-1-{s}" for s in (1, 5, 7, 12)}
        sources = {
            (w.window_size.seconds, w.window_start.ToDatetime(tzinfo=UTC)): ranges(w.sources)
            for w in windows
        }
        assert sources == {
            (10, T0): expected_sources(topics.clean, positions, [ids[1], ids[5], ids[7]]),
            (10, T0 + timedelta(seconds=10)): expected_sources(topics.clean, positions, [ids[12]]),
            (20, T0 - timedelta(seconds=10)): expected_sources(
                topics.clean, positions, [ids[1], ids[5], ids[7]]
            ),
            (20, T0): expected_sources(topics.clean, positions, ids.values()),
            (20, T0 + timedelta(seconds=10)): expected_sources(topics.clean, positions, [ids[12]]),
        }
        assert [p for _, p, *_ in sources[(20, T0)]] == [0, 1]

        # Beyond the watermark: dropped, counted; its window stays as it was.
        publish(producer, topics.clean, [reading("t-1", 3, 99.0)])
        wait_until(
            lambda: job.counter("transform_late_rows_dropped_total", QUERY) >= 1,
            60,
            "the late event was not counted",
        )
        assert "late.dropped" in job.log_text()

        letters = [
            events_pb2.DeadLetter.FromString(v)
            for v in read_topic(infra.kafka, topics.dlq, wanted=1, timeout=60)
        ]
        assert [(d.reason, d.original_value) for d in letters] == [
            ("undecodable", b"\x00 not a CleanEvent")
        ]
        assert letters[0].source.topic == topics.clean

        assert job.terminate() == 0
        assert "transform.stopped" in job.log_text()
    finally:
        job.close()

    stored = (
        spark.read.parquet(str(job.offline_dir))
        .where("entity_id = 't-1' AND window = 'tumbling-10s'")
        .collect()
    )
    assert sorted((r["count"], r.mean) for r in stored) == [(1, 30.0), (3, statistics.mean(values))]
    assert {r.window_start.astimezone(UTC): [tuple(s) for s in r.sources] for r in stored} == {
        start: sources[(10, start)] for start in (T0, T0 + timedelta(seconds=10))
    }
    # Partitioned by date and metric (the date partition reads back as a date).
    assert {(str(r.date), r.metric) for r in stored} == {("2026-11-22", "temperature")}

    online = make_redis(infra.redis).hgetall(online_key(topics.redis_prefix, "t-1"))
    latest = decode_window(online[online_field("temperature", "tumbling-10s").encode()])
    assert (latest.count, latest.mean) == (1, 30.0)
    assert ranges(latest.sources) == sources[(10, T0 + timedelta(seconds=10))]
    assert latest.window_end.ToDatetime(tzinfo=UTC) == T0 + timedelta(seconds=20)
    # The online value is the window's record on the features topic, byte for byte.
    assert online[b"temperature@tumbling-10s"] in records
    latest_sliding = decode_window(online[b"temperature@sliding-20s-every-10s"])
    assert (latest_sliding.count, latest_sliding.mean) == (1, 30.0)


@QUERIES
def test_open_windows_running_aggregates_reach_redis_before_they_close(
    infra: Infra, topics: TransformTopics, producer: BusProducer, tmp_path: Path, queries: str
) -> None:
    job = TransformJob(
        infra,
        topics,
        tmp_path / "job",
        AISTACK_TRANSFORM_SLIDING_WINDOW_SECONDS="20",
        AISTACK_TRANSFORM_SLIDING_SLIDE_SECONDS="10",
        AISTACK_TRANSFORM_OPEN_WINDOWS="all",
        AISTACK_TRANSFORM_QUERIES=queries,
    )
    store = make_redis(infra.redis)
    key = online_key(topics.redis_prefix, "t-2")
    tumbling = open_field(online_field("temperature", "tumbling-10s"))
    sliding = open_field(online_field("temperature", "sliding-20s-every-10s"))

    def stored(field: str) -> features_pb2.FeatureWindow | None:
        value = store.hget(key, field)
        return None if value is None else decode_window(value)

    def reaches(field: str, start: float, count: int) -> None:
        def holds() -> bool:
            window = stored(field)
            return window is not None and (window.window_start.seconds, window.count) == (
                int((T0 + timedelta(seconds=start)).timestamp()),
                count,
            )

        wait_until(holds, 120, f"{field} never held {count} from {start}: {stored(field)}")

    try:
        publish(producer, topics.clean, [reading("t-2", s, v) for s, v in [(1, 20.0), (2, 22.0)]])
        reaches(tumbling, 0, 2)
        window = stored(tumbling)
        assert window is not None
        assert window.open and (window.mean, window.min, window.max, window.last) == (
            21.0, 20.0, 22.0, 22.0,
        )  # fmt: skip
        positions = clean_positions(infra.kafka, topics.clean, wanted=2)
        assert ranges(window.sources) == expected_sources(
            topics.clean, positions, ["t-2-1", "t-2-2"]
        )
        # The closed field waits for the watermark; the open one did not.
        assert store.hget(key, online_field("temperature", "tumbling-10s")) is None
        # Of the two sliding windows holding the latest reading, the fuller.
        reaches(sliding, -10, 2)

        publish(producer, topics.clean, [reading("t-2", 3, 30.0)])
        reaches(tumbling, 0, 3)
        # The next tumbling window replaces the one before it.
        publish(producer, topics.clean, [reading("t-2", 11, 24.0)])
        reaches(tumbling, 10, 1)
        reaches(sliding, 0, 4)
        # A late reading (inside the watermark) updates an older window: the
        # store keeps the newer tumbling one, and the sliding one counts it.
        publish(producer, topics.clean, [reading("t-2", 8, 25.0)])
        reaches(sliding, 0, 5)
        reaches(tumbling, 10, 1)
        assert job.counter("transform_windows_out_total", '{query="open-windows"}') >= 5
    finally:
        store.close()
        job.close()


@QUERIES
def test_a_killed_job_resumes_from_its_checkpoint_without_losing_or_doubling_a_window(
    infra: Infra,
    topics: TransformTopics,
    producer: BusProducer,
    tmp_path: Path,
    spark: Any,
    queries: str,
) -> None:
    # One reading a second for 200 s: 20 windows of 10 readings, values 0..199.
    events = [reading("t-k", s, float(s)) for s in range(200)]
    state = tmp_path / "job"
    job = TransformJob(infra, topics, state, AISTACK_TRANSFORM_QUERIES=queries)
    try:
        publish(producer, topics.clean, events[:100])  # closes the first 9 windows
        wait_until(
            lambda: job.counter("transform_windows_out_total", QUERY) >= 3,
            180,
            "no window was written before the kill",
        )
        job.kill()
    finally:
        job.close()
    publish(producer, topics.clean, [*events[100:], reading("clock", 260, 0.0)])

    restarted = TransformJob(infra, topics, state, AISTACK_TRANSFORM_QUERIES=queries)
    try:
        wait_until(lambda: len(read_window_keys(infra, topics)) >= 20, 180, "windows are missing")
        assert restarted.terminate() == 0
    finally:
        restarted.close()

    stored = spark.read.parquet(str(restarted.offline_dir)).where("entity_id = 't-k'").collect()
    starts = sorted(r.window_start.astimezone(UTC) for r in stored)
    assert starts == [T0 + timedelta(seconds=10 * i) for i in range(20)]  # none missing or twice
    assert all(r["count"] == 10 for r in stored)
    assert sorted(r.min for r in stored) == [float(10 * i) for i in range(20)]
    # Offsets 0..199 of one partition, ten to a window, across the restart too.
    partition = {s.partition for r in stored for s in r.sources}
    assert len(partition) == 1
    assert sorted(tuple(s) for r in stored for s in r.sources) == [
        (topics.clean, *partition, 10 * i, 10 * i + 9, 10) for i in range(20)
    ]
    online = make_redis(infra.redis).hgetall(online_key(topics.redis_prefix, "t-k"))
    latest = decode_window(online[b"temperature@tumbling-10s"])
    assert latest.window_end.ToDatetime(tzinfo=UTC) == T0 + timedelta(seconds=200)
    assert (latest.count, latest.max) == (10, 199.0)
    assert [(s.min_offset, s.max_offset, s.count) for s in latest.sources] == [(190, 199, 10)]


def read_window_keys(infra: Infra, topics: TransformTopics) -> set[str]:
    values = read_topic(infra.kafka, topics.features, wanted=10_000, timeout=3)
    windows = map(features_pb2.FeatureWindow.FromString, values)
    return {w.window_key for w in windows if w.entity_id == "t-k"}
