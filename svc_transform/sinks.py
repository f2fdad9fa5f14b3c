"""Where windows go: closed ones to the features topic, the Parquet offline
store and Redis; open ones' running aggregates to Redis (``OpenWindowSink``).

Each micro-batch of a window query goes to all three (``WindowSink``). A batch
Spark runs again after a restart has the same id and the same rows, so:

* Parquet: the batch's rows replace its own partition (``batch=<id>`` under
  date, metric and window kind), never anyone else's: no row twice. On a
  local filesystem Spark's dynamic partition overwrite does it (a rename
  into place), or for a batch of a few windows the driver, the same way
  (``svc_transform.driver_parquet``). On the object store (``s3a://``) S3A's magic committer
  writes without rename and cannot overwrite by partition: the batch's
  files are appended, and before a batch that may have been written already
  (the first a sink runs: Spark runs an unfinished batch again only after a
  restart) the partitions it writes are deleted first.
* Redis: a window only replaces an older one (compared by window end).
* Kafka: at least once; the record key is the entity and ``ce_id`` the
  window key, by which consumers drop repeats.

An open window's running aggregate replaces the stored one only when it
ends later or is the same window counting at least as many events, so a
replayed batch changes nothing and a late batch never turns the store back.

Both stores' layouts are ``shared.feature_store``'s; a Redis value is the
same FeatureWindow bytes as the window's Kafka record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import pyarrow as pa
from pyspark.sql import functions as F

from shared.bus import envelope
from shared.bus.codec import type_name
from shared.bus.deadletter import ERROR_HEADER, SOURCE_HEADER
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.feature_store import (
    OFFLINE_COLUMNS,
    PARTITION_COLUMNS,
    online_field,
    online_key,
    open_field,
)
from shared.log import get_logger
from shared.object_store import is_object_url, scheme
from shared.redis_client import REDIS_RIDE_OUT_SECONDS, make_redis
from shared.settings import KafkaSettings, RedisSettings
from svc_transform.driver_parquet import ParquetOptions, partition_namer, write_batch
from svc_transform.functions import ENCODE_DEAD_LETTER
from svc_transform.windows import feature_window_bytes

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row

SERVICE = "svc_transform"
FEATURE_WINDOW_TYPE = type_name(FeatureWindow)

log = get_logger("svc_transform")

# The partitions a window's row gives; the sink adds the batch's own.
_ROW_PARTITIONS = tuple(name for name in PARTITION_COLUMNS if name != "batch")

# Replace the stored window only with a newer one; keep the key alive.
_SET_IF_NEWER = """
local stored = redis.call('HGET', KEYS[1], ARGV[1] .. ':end')
if (not stored) or tonumber(stored) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3], ARGV[1] .. ':end', ARGV[2])
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
"""


# An open window replaces the stored one when it ends later (that one has
# closed) or is the same window counting as many events or more.
_SET_IF_FRESHER = """
local stored_end = tonumber(redis.call('HGET', KEYS[1], ARGV[1] .. ':end') or '-1')
local stored_count = tonumber(redis.call('HGET', KEYS[1], ARGV[1] .. ':count') or '-1')
local ends, count = tonumber(ARGV[2]), tonumber(ARGV[3])
if stored_end < ends or (stored_end == ends and stored_count <= count) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[4], ARGV[1] .. ':end', ARGV[2],
             ARGV[1] .. ':count', ARGV[3])
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
"""


#: How long the broker holds a read's fetch that finds no new records (the
#: consumer's default: 500 ms). A task reads a range known before it starts,
#: and its pooled consumer has sent the next fetch past the range's end when it
#: handed out the last records: a task that reached the end of the topic waited
#: that fetch out, and the last batch of a backlog took 1.6 s where the others
#: took 0.6 s (100,000 records each, the build machine).
SOURCE_FETCH_WAIT_MS = 10

#: A read's fetch and poll sizes (the consumer's defaults: 1 MiB a partition,
#: 500 records). A task reads its range in polls, and waits for a fetch each
#: time its consumer has handed out the last one's records: a task's third of
#: a backlog's batch of 100,000 records (some 350 bytes each, headers and
#: all) is about a dozen 1 MiB fetches. Five peak reads each way, alternating:
#: 5.6% faster on average, faster in each pair.
SOURCE_FETCH_BYTES = 8 * 1024 * 1024
SOURCE_POLL_RECORDS = 10_000


def kafka_options(kafka: KafkaSettings) -> dict[str, str]:
    """Connection and security for Spark's Kafka source and sink."""
    return {f"kafka.{key}": value for key, value in kafka.java_client_config().items()}


def kafka_source_options(kafka: KafkaSettings) -> dict[str, str]:
    """The source's (and a batch read's): ``kafka_options``, a short fetch
    wait (``SOURCE_FETCH_WAIT_MS``) and larger fetches and polls."""
    return {
        **kafka_options(kafka),
        "kafka.fetch.max.wait.ms": str(SOURCE_FETCH_WAIT_MS),
        "kafka.max.partition.fetch.bytes": str(SOURCE_FETCH_BYTES),
        "kafka.max.poll.records": str(SOURCE_POLL_RECORDS),
    }


def kafka_sink_options(kafka: KafkaSettings) -> dict[str, str]:
    """The sink's: written when every in-sync replica has it, as every aistack
    producer writes (the Java client's default too, said here so that no
    version changes it)."""
    return {**kafka_options(kafka), "kafka.acks": "all"}


def envelope_headers(message_type: str, event_id: Column) -> Column:
    """The CloudEvents headers every aistack record carries, with a new trace."""
    trace = F.concat(
        F.lit("00-"),
        F.regexp_replace(F.expr("uuid()"), "-", ""),
        F.lit("-"),
        F.substring(F.regexp_replace(F.expr("uuid()"), "-", ""), 1, 16),
        F.lit("-01"),
    )
    pairs = [
        (envelope.CONTENT_TYPE, F.lit(envelope.PROTOBUF_CONTENT_TYPE)),
        (envelope.SPECVERSION, F.lit(envelope.CLOUDEVENTS_VERSION)),
        (envelope.TYPE, F.lit(message_type)),
        (envelope.ID, event_id),
        (envelope.SOURCE, F.lit(SERVICE)),
        (envelope.TRACEPARENT, trace),
    ]
    return F.array(
        *[
            F.struct(F.lit(key).alias("key"), value.cast("binary").alias("value"))
            for key, value in pairs
        ]
    )


#: A dead letter's reason: the record is not a usable CleanEvent.
UNDECODABLE = "undecodable"


def undecodable_letters(failed: DataFrame) -> DataFrame:
    """Records that are not usable CleanEvents (the Kafka source's ``key``,
    ``value``, ``headers``, ``topic``, ``partition``, ``offset``, and why:
    ``error``) as aistack.v1.DeadLetter records for the DLQ."""
    position = F.concat_ws("/", "topic", "partition", "offset")
    letter = F.struct(
        F.lit(UNDECODABLE).alias("reason"),
        F.col("error").alias("message"),
        F.col("value").alias("original_value"),
        F.col("key").alias("original_key"),
        F.col("headers").alias("original_headers"),
        F.struct("topic", "partition", "offset").alias("source"),
        F.lit(SERVICE).alias("service"),
        F.current_timestamp().alias("rejected_time"),
    )
    headers = F.concat(
        envelope_headers("aistack.v1.DeadLetter", position),
        F.array(
            F.struct(
                F.lit(ERROR_HEADER).alias("key"), F.lit(UNDECODABLE).cast("binary").alias("value")
            ),
            F.struct(F.lit(SOURCE_HEADER).alias("key"), position.cast("binary").alias("value")),
        ),
    )
    return failed.select(
        "key", F.call_udf(ENCODE_DEAD_LETTER, letter).alias("value"), headers.alias("headers")
    )


class WindowSink:
    """``foreachBatch`` target of the window query: every closed window of a
    micro-batch, whatever its spec (the ``window`` column names it)."""

    def __init__(
        self,
        *,
        kafka: KafkaSettings,
        redis: RedisSettings,
        features_topic: str,
        offline_path: str,
        online_key_prefix: str,
        online_ttl_seconds: int,
        driver_max_windows: int = 0,
        on_written: Callable[[int], None] = lambda count: None,
        expected_rows: Callable[[], int | None] = lambda: None,
    ) -> None:
        # Runs in the driver: how many windows a batch wrote (Spark does not
        # report output rows for foreachBatch).
        self._on_written = on_written
        # How many rows the next batch is expected to read (None: unknown).
        self._expected_rows = expected_rows
        self._kafka_options = kafka_sink_options(kafka)
        self._redis = redis
        self._topic = features_topic
        self._offline_path = offline_path
        # On the object store: the last batch this sink wrote (None: none yet).
        self._appended: int | None = None
        self._prefix = online_key_prefix
        self._ttl = online_ttl_seconds
        self._kafka = kafka
        self._driver_max_windows = driver_max_windows
        self._producer: BusProducer | None = None
        self._headers = envelope.HeaderTemplate(FEATURE_WINDOW_TYPE, SERVICE)
        # The two stores are written concurrently on the cached windows: the
        # batch takes the slower one's time, not their sum.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="window-store")
        # The offline columns' Spark schema (JSON) by their Arrow schema, and
        # Spark's names for partitions: asked of the JVM once, not per batch.
        self._spark_schemas: dict[pa.Schema, str] = {}
        self._name_partition: Callable[[Sequence[str | None]], str] | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        batch.persist()
        try:
            if self._few_expected():
                # The collect itself computes the batch into its cache: one
                # job where a count and then a collect were two.
                table = self.collect(batch)
                seconds = {"aggregate_s": _since(started)}
                self.write_collected(batch, table, batch_id, seconds, started)
                return
            count = batch.count()
            if not count:
                return
            seconds = {"aggregate_s": _since(started)}
            if count <= self._driver_max_windows:
                counted = time.perf_counter()
                table = self.collect(batch)
                seconds["collect_s"] = _since(counted)
                self.write_collected(batch, table, batch_id, seconds, started)
                return
            # Kafka first and alone: it is what downstream services wait on.
            seconds["kafka_s"] = _timed(partial(self.to_kafka, batch))
            stores = {
                "parquet": partial(self.to_parquet, batch, batch_id),
                "redis": partial(self.to_redis, batch),
            }
            self._write_stores(stores, count, batch_id, seconds, started)
        finally:
            batch.unpersist()

    def write_collected(
        self,
        batch: DataFrame,
        table: pa.Table,
        batch_id: int,
        seconds: dict[str, float],
        started: float,
    ) -> None:
        """A few windows (``collect``'s ``table`` of ``batch``): the driver
        writes all three stores (no Kafka job, no Python workers, no Parquet
        job on a local store), Kafka first; ``seconds`` (what getting them
        took, since ``started``) goes into the ``windows.written`` line."""
        if not table.num_rows:
            return
        windows = rows_of(table, _DriverWindow)
        seconds["kafka_s"] = _timed(partial(self._produce, windows))
        stores = {
            "parquet": partial(self.to_parquet_collected, batch, table, batch_id),
            "redis": partial(_write_online, windows, self._redis, self._prefix, self._ttl),
        }
        self._write_stores(stores, table.num_rows, batch_id, seconds, started)

    def _write_stores(
        self,
        stores: Mapping[str, Callable[[], None]],
        count: int,
        batch_id: int,
        seconds: dict[str, float],
        started: float,
    ) -> None:
        """The offline and online stores at once, after Kafka; logs each part's time."""
        running = {name: self._pool.submit(_timed, write) for name, write in stores.items()}
        # Every sink must finish (or the batch fails and Spark runs it again).
        seconds |= {f"{name}_s": future.result() for name, future in running.items()}
        self._on_written(count)
        log.debug(
            "windows.written",
            batch=batch_id,
            windows=count,
            **seconds,
            total_s=_since(started),
        )

    def _few_expected(self) -> bool:
        """Whether the batch is expected to read no more rows than the driver
        writes windows: its windows are then collected without counting them
        first (a batch's closed windows are at most its state's, which a
        batch of a few rows rarely closes by the thousand)."""
        expected = self._expected_rows()
        limit = self._driver_max_windows
        return limit > 0 and expected is not None and expected <= limit

    def collect(self, batch: DataFrame) -> pa.Table:
        """The batch's windows as the driver writes them: the offline
        store's columns and partitions but the batch, and Redis's and
        Kafka's (the end, the FeatureWindow bytes)."""
        return batch.select(
            *OFFLINE_COLUMNS,
            *_ROW_PARTITIONS,
            *_online_values(),
        ).toArrow()

    def to_parquet_collected(self, batch: DataFrame, table: pa.Table, batch_id: int) -> None:
        """The collected windows (``table``) into a local offline store, as
        Spark's write of ``batch`` would lay them out (``driver_parquet``);
        anywhere else, or where the session's Parquet settings are not
        pyarrow's to honour, Spark's write of the batch in one task."""
        options = ParquetOptions.of(batch.sparkSession.conf.get)
        if scheme(self._offline_path) or options is None:
            self.to_parquet(batch.coalesce(1), batch_id)
            return
        rows = table.select([*OFFLINE_COLUMNS, *_ROW_PARTITIONS])
        rows = rows.append_column("batch", pa.array([batch_id] * rows.num_rows, pa.int64()))
        schema = self._spark_schemas.get(rows.schema)
        if schema is None:
            # The query's columns do not change while it runs: asked once.
            schema = batch.select(*OFFLINE_COLUMNS).schema.json()
            self._spark_schemas[rows.schema] = schema
        if self._name_partition is None:
            self._name_partition = partition_namer(batch.sparkSession, PARTITION_COLUMNS)
        write_batch(
            rows,
            Path(self._offline_path),
            partition_columns=PARTITION_COLUMNS,
            spark_schema=schema,
            options=options,
            partition_path=self._name_partition,
        )

    def _produce(self, rows: Iterable[Any]) -> None:
        """The windows to the features topic as Spark's Kafka sink writes
        them (key the entity, the envelope's id the window key, every
        in-sync replica), and on to the next batch only once all are."""
        producer = self._producer
        if producer is None:
            # Java's partitioner: a key lands where Spark's sink puts it.
            producer = self._producer = BusProducer(
                self._kafka, source=SERVICE, config={"partitioner": "murmur2_random"}
            )
        headers = self._headers
        for row in rows:
            producer.publish_raw(
                self._topic,
                bytes(row.value),
                key=row.entity_id.encode(),
                headers=headers.build(row.window_key, envelope.new_traceparent()),
            )
        producer.flush()

    def to_kafka(self, batch: DataFrame) -> None:
        records = batch.select(
            F.col("entity_id").cast("binary").alias("key"),
            feature_window_bytes().alias("value"),
            envelope_headers(FEATURE_WINDOW_TYPE, F.col("window_key")).alias("headers"),
        )
        (
            records.write.format("kafka")
            .options(**self._kafka_options)
            .option("topic", self._topic)
            .save()
        )

    def to_parquet(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.withColumn("batch", F.lit(batch_id).cast("long")).select(
            *OFFLINE_COLUMNS, *PARTITION_COLUMNS
        )
        if not is_object_url(self._offline_path):
            (
                rows.write.mode("overwrite")
                .option("partitionOverwriteMode", "dynamic")
                .partitionBy(*PARTITION_COLUMNS)
                .parquet(self._offline_path)
            )
            return
        if self._appended is None or batch_id <= self._appended:
            _delete_partitions(rows, self._offline_path)
        rows.write.mode("append").partitionBy(*PARTITION_COLUMNS).parquet(self._offline_path)
        self._appended = batch_id

    def to_redis(self, batch: DataFrame) -> None:
        settings, prefix, ttl = self._redis, self._prefix, self._ttl

        def write(rows: Iterable[Row]) -> None:
            _write_online(rows, settings, prefix, ttl)

        batch.select(*_online_columns()).foreachPartition(write)


def _delete_partitions(rows: DataFrame, root: str) -> None:
    """Delete the partitions under ``root`` that ``rows`` (with all of
    ``PARTITION_COLUMNS``) would write to, through Spark's own Hadoop
    filesystem and its names for partition values."""
    spark = rows.sparkSession
    jvm = spark._jvm
    assert jvm is not None
    hadoop = jvm.org.apache.hadoop.fs
    base = hadoop.Path(root)
    filesystem = base.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
    name_partition = partition_namer(spark, PARTITION_COLUMNS)
    for values in rows.select(*PARTITION_COLUMNS).distinct().collect():
        relative = name_partition([str(value) for value in values])
        if filesystem.delete(hadoop.Path(base, relative), True):
            log.info("parquet.replaced", partition=relative)


class _DriverWindow(NamedTuple):
    """A closed window as the driver writes it to Kafka and Redis."""

    entity_id: str
    metric: str
    path: str
    window: str
    window_key: str
    end_ms: int
    value: bytes


class OpenWindow(NamedTuple):
    """An open window as ``OpenWindowSink.write`` takes it."""

    entity_id: str
    metric: str
    path: str
    window: str
    end_ms: int
    last_us: int
    n: int
    value: bytes


_Row = TypeVar("_Row", bound=tuple[Any, ...])


def rows_of(table: pa.Table, row: type[_Row]) -> list[_Row]:
    """``table``'s rows as ``row`` named tuples, each field the column of its name."""
    fields: tuple[str, ...] = row._fields  # type: ignore[attr-defined]
    columns = (table.column(name).to_pylist() for name in fields)
    return [row(*values) for values in zip(*columns, strict=True)]


def _online_columns() -> list[Column | str]:
    """A closed window as ``_write_online`` stores it: its field's parts, its
    end (which replaces which) and its FeatureWindow bytes."""
    return ["entity_id", "metric", "path", "window", *_online_values()]


def _online_values(value: Column | None = None) -> list[Column]:
    """A window's end (which replaces which) and its FeatureWindow bytes:
    ``value``, the closed window's by default."""
    value = feature_window_bytes() if value is None else value
    return [F.unix_millis("window_end").alias("end_ms"), value.alias("value")]


def _running_values() -> list[Column]:
    """What picks the open window to serve: its last reading's time, its count."""
    # Not "count": a Row is a tuple, whose count is a method.
    return [F.unix_micros("last_event_time").alias("last_us"), F.col("count").alias("n")]


def any_window_columns(value: Column) -> list[Column | str]:
    """A window, closed or open, as the driver writes either from one collect
    (``WindowSink.write_collected``, ``OpenWindowSink.write``): ``value`` its
    FeatureWindow bytes."""
    return [*OFFLINE_COLUMNS, *_ROW_PARTITIONS, *_running_values(), *_online_values(value)]


class OpenWindowSink:
    """``foreachBatch`` target of the open-window query (update output mode):
    per entity and field, the running aggregate of the most complete open
    window that counts the entity's latest reading, into the online store's
    open field."""

    def __init__(
        self,
        *,
        redis: RedisSettings,
        online_key_prefix: str,
        online_ttl_seconds: int,
        on_written: Callable[[int], None] = lambda count: None,
    ) -> None:
        self._redis = redis
        self._prefix = online_key_prefix
        self._ttl = online_ttl_seconds
        self._on_written = on_written

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        # A few rows per entity: the driver writes them, with no Python
        # workers to start and no shuffle on the way to the store.
        self.write(batch.select(*_open_window_columns()).collect())

    def write(self, rows: Iterable[Any]) -> None:
        """Windows with ``OpenWindow``'s fields into the online store."""
        self._on_written(_write_open(rows, self._redis, self._prefix, self._ttl))


def _open_window_columns() -> list[Column | str]:
    """An open window as ``OpenWindowSink`` stores it (``OpenWindow``'s fields)."""
    return [
        "entity_id",
        "metric",
        "path",
        "window",
        *_running_values(),
        *_online_values(feature_window_bytes(open_window=True)),
    ]


def freshest_open_windows(rows: Iterable[Any]) -> list[Any]:
    """Per (entity, metric, path, window kind), of the windows a micro-batch
    updated, the one to serve: among those that hold the group's latest
    reading (end after it), the earliest-ending, which has counted the most.
    A late reading's window that no longer holds the latest reading is left
    for the closed-window query."""
    groups: dict[tuple[str, str, str, str], list[Any]] = {}
    for row in rows:
        groups.setdefault((row.entity_id, row.metric, row.path, row.window), []).append(row)
    chosen = []
    for windows in groups.values():
        latest_us = max(w.last_us for w in windows)
        holding = [w for w in windows if w.end_ms * 1000 > latest_us]
        chosen.append(min(holding or windows, key=lambda w: w.end_ms))
    return chosen


def _write_open(rows: Iterable[Any], settings: RedisSettings, prefix: str, ttl: int) -> int:
    chosen = freshest_open_windows(rows)
    if not chosen:
        return 0
    client = make_redis(settings, ride_out_seconds=REDIS_RIDE_OUT_SECONDS)
    try:
        set_if_fresher = client.register_script(_SET_IF_FRESHER)
        pipe = client.pipeline(transaction=False)
        for row in chosen:
            set_if_fresher(
                keys=[online_key(prefix, row.entity_id)],
                args=[
                    open_field(online_field(row.metric, row.window, row.path)),
                    row.end_ms,
                    row.n,
                    bytes(row.value),
                    ttl,
                ],
                client=pipe,
            )
        pipe.execute()
    finally:
        client.close()
    return len(chosen)


def _timed(write: Callable[[], None]) -> float:
    started = time.perf_counter()
    write()
    return _since(started)


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def _write_online(rows: Iterable[Any], settings: RedisSettings, prefix: str, ttl: int) -> None:
    client = make_redis(settings, ride_out_seconds=REDIS_RIDE_OUT_SECONDS)
    try:
        set_if_newer = client.register_script(_SET_IF_NEWER)
        pipe = client.pipeline(transaction=False)
        pending = 0
        for row in rows:
            set_if_newer(
                keys=[online_key(prefix, row.entity_id)],
                args=[
                    online_field(row.metric, row.window, row.path),
                    row.end_ms,
                    bytes(row.value),
                    ttl,
                ],
                client=pipe,
            )
            pending += 1
            if pending >= 500:
                pipe.execute()
                pending = 0
        if pending:
            pipe.execute()
    finally:
        client.close()
