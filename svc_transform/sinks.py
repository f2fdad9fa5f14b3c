"""Where closed windows go: the features topic, the Parquet offline store, Redis.

Each micro-batch of a window query goes to all three (``WindowSink``). A batch
Spark runs again after a restart has the same id and the same rows, so:

* Parquet: the batch's rows replace its own partition (``batch=<id>`` under
  date, metric and window kind), never anyone else's: no row twice.
* Redis: a window only replaces an older one (compared by window end).
* Kafka: at least once; the record key is the entity and ``ce_id`` the
  window key, by which consumers drop repeats.

Both stores' layouts are ``shared.feature_store``'s; a Redis value is the
same FeatureWindow bytes as the window's Kafka record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from shared.bus import envelope
from shared.feature_store import OFFLINE_COLUMNS, PARTITION_COLUMNS, online_field, online_key
from shared.log import get_logger
from shared.redis_client import make_redis
from shared.settings import KafkaSettings, RedisSettings
from svc_transform.windows import feature_window_bytes

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row

SERVICE = "svc_transform"

log = get_logger("svc_transform")

# Replace the stored window only with a newer one; keep the key alive.
_SET_IF_NEWER = """
local stored = redis.call('HGET', KEYS[1], ARGV[1] .. ':end')
if (not stored) or tonumber(stored) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3], ARGV[1] .. ':end', ARGV[2])
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
"""


def kafka_options(kafka: KafkaSettings) -> dict[str, str]:
    """Connection and security for Spark's Kafka source and sink."""
    return {f"kafka.{key}": value for key, value in kafka.java_client_config().items()}


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
        on_written: Callable[[int], None] = lambda count: None,
    ) -> None:
        # Runs in the driver: how many windows a batch wrote (Spark does not
        # report output rows for foreachBatch).
        self._on_written = on_written
        self._kafka_options = kafka_options(kafka)
        self._redis = redis
        self._topic = features_topic
        self._offline_path = offline_path
        self._prefix = online_key_prefix
        self._ttl = online_ttl_seconds
        # The two stores are written as concurrent Spark jobs on the cached
        # windows: the batch takes the slower one's time, not their sum.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="window-store")

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        batch.persist()
        try:
            count = batch.count()
            if not count:
                return
            counted = time.perf_counter()
            # Kafka first and alone: it is what downstream services wait on.
            seconds = {"kafka_s": _timed(lambda: self.to_kafka(batch))}
            stores = {
                "parquet": lambda: self.to_parquet(batch, batch_id),
                "redis": lambda: self.to_redis(batch),
            }
            running = {name: self._pool.submit(_timed, write) for name, write in stores.items()}
            # Every sink must finish (or the batch fails and Spark runs it again).
            seconds |= {f"{name}_s": future.result() for name, future in running.items()}
            self._on_written(count)
            log.debug(
                "windows.written",
                batch=batch_id,
                windows=count,
                aggregate_s=round(counted - started, 3),
                **seconds,
                total_s=round(time.perf_counter() - started, 3),
            )
        finally:
            batch.unpersist()

    def to_kafka(self, batch: DataFrame) -> None:
        records = batch.select(
            F.col("entity_id").cast("binary").alias("key"),
            feature_window_bytes().alias("value"),
            envelope_headers("aistack.v1.FeatureWindow", F.col("window_key")).alias("headers"),
        )
        (
            records.write.format("kafka")
            .options(**self._kafka_options)
            .option("topic", self._topic)
            .save()
        )

    def to_parquet(self, batch: DataFrame, batch_id: int) -> None:
        (
            batch.withColumn("batch", F.lit(batch_id).cast("long"))
            .select(*OFFLINE_COLUMNS, *PARTITION_COLUMNS)
            .write.mode("overwrite")
            .option("partitionOverwriteMode", "dynamic")
            .partitionBy(*PARTITION_COLUMNS)
            .parquet(self._offline_path)
        )

    def to_redis(self, batch: DataFrame) -> None:
        settings, prefix, ttl = self._redis, self._prefix, self._ttl

        def write(rows: Iterable[Row]) -> None:
            _write_online(rows, settings, prefix, ttl)

        batch.select(
            "entity_id",
            "metric",
            "path",
            "window",
            F.unix_millis("window_end").alias("end_ms"),
            feature_window_bytes().alias("value"),
        ).foreachPartition(write)


def _timed(write: Callable[[], None]) -> float:
    started = time.perf_counter()
    write()
    return round(time.perf_counter() - started, 3)


def _write_online(rows: Iterable[Any], settings: RedisSettings, prefix: str, ttl: int) -> None:
    client = make_redis(settings)
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
