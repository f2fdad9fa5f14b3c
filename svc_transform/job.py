"""The streaming queries of svc_transform and how they start and stop.

By default (``AISTACK_TRANSFORM_QUERIES=one``) one query reads the clean
topic and gives every window kind's closed windows (tumbling, and sliding
when configured) to a ``WindowSink``, the open windows' running aggregates
to the online store (``OpenWindowSink``: a closed window leaves Spark only
once the watermark passes it, and a model fed by entity should see the last
second's readings) and what does not decode to the dead-letter topic
(``svc_transform.single_query``). With ``three``, each of those is a query
of its own: the closed windows', the open windows' (update output mode, on
a fast trigger) and the dead letters' (stateless, on a slower trigger).
Each query has its own checkpoint under the checkpoint directory, so a
killed job resumes each where it stopped.
"""

from __future__ import annotations

import ast
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import (
    JStreamingQueryListener,
    QueryProgressEvent,
    StreamingQueryListener,
)

from shared.bus.lag import ConsumerLag, behind
from shared.log import get_logger
from shared.object_store import checkpoint_options, hadoop_url
from svc_transform.codegen import BatchSizes, ByBatchSize
from svc_transform.functions import CLEAN_EVENT_ERROR
from svc_transform.metrics import TransformMetrics
from svc_transform.single_query import KindSink, all_windows
from svc_transform.sinks import (
    SERVICE,
    OpenWindowSink,
    WindowSink,
    kafka_sink_options,
    kafka_source_options,
    undecodable_letters,
)
from svc_transform.windows import (
    WindowSpec,
    aggregate,
    running_windows,
    window_specs,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from svc_transform.settings import TransformSettings

log = get_logger("svc_transform")

DEAD_LETTERS_QUERY = "dead-letters"
WINDOWS_QUERY = "windows"
OPEN_WINDOWS_QUERY = "open-windows"
#: The single query's checkpoint, under the checkpoint directory.
SINGLE_QUERY_CHECKPOINT = "all-windows"


def read_clean_events(
    spark: SparkSession, settings: TransformSettings, *, headers: bool
) -> DataFrame:
    """The clean topic as Kafka records; ``headers`` only where they are used
    (turning each record's headers into rows costs a fifth of a plain read)."""
    reader = spark.readStream.format("kafka")
    if settings.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
    return (
        reader.options(**kafka_source_options(settings.kafka))
        .option("subscribe", settings.source_topic)
        .option("startingOffsets", settings.starting_offsets)
        .option("includeHeaders", str(headers).lower())
        # svc_ingest writes in transactions: what a killed one aborted is on
        # the topic too, and must count in no window.
        .option("kafka.isolation.level", "read_committed")
        # Offsets the broker deleted (retention) are skipped with a warning
        # instead of stopping the query for good.
        .option("failOnDataLoss", "false")
        .load()
    )


def dead_letter_records(records: DataFrame) -> DataFrame:
    """Records that are not usable CleanEvents, as aistack.v1.DeadLetter records for the DLQ."""
    # Evaluated again only for the rows that fail: the projection below sees no others.
    return undecodable_letters(
        records.select("*", F.call_udf(CLEAN_EVENT_ERROR, "value").alias("error")).where(
            F.col("error").isNotNull()
        )
    )


@dataclass
class Job:
    """The started queries; ``stop`` ends them between micro-batches."""

    spark: SparkSession
    queries: list[StreamingQuery] = field(default_factory=list)

    def await_any(self, timeout_seconds: int) -> bool:
        """True once a query has ended (an error in it is raised here)."""
        return bool(self.spark.streams.awaitAnyTermination(max(1, timeout_seconds)))

    def stop(self, timeout_seconds: float = 60.0) -> None:
        """Stop each query when no trigger is active: stopping mid-batch makes the
        state store log errors and leaves work to redo. The open-window query
        stops at once, first: under load its batches run back to back, so it
        is never between two, and a batch it redoes only rewrites Redis with
        the same values."""
        deadline = time.monotonic() + timeout_seconds
        for query in sorted(self.queries, key=lambda q: q.name != OPEN_WINDOWS_QUERY):
            while (
                query.name != OPEN_WINDOWS_QUERY
                and query.isActive
                and query.status["isTriggerActive"]
            ):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            query.stop()


def start(spark: SparkSession, settings: TransformSettings, metrics: TransformMetrics) -> Job:
    # Hadoop's name for an object on the store (s3a://), as Spark reads it.
    checkpoint = hadoop_url(settings.checkpoint_path()).rstrip("/")
    for key, value in checkpoint_options(checkpoint).items():
        # Read as each query starts; every query's checkpoint is under this one.
        spark.conf.set(key, value)
    sizes = BatchSizes()
    spark.streams.addListener(ProgressListener(metrics, sizes))
    job = Job(spark)
    sink = WindowSink(
        kafka=settings.kafka,
        redis=settings.redis,
        features_topic=settings.features_topic,
        offline_path=hadoop_url(settings.offline_path()),
        online_key_prefix=settings.online_key_prefix,
        online_ttl_seconds=settings.online_ttl_seconds,
        driver_max_windows=settings.driver_write_max_windows,
        on_written=metrics.windows_out.labels(WINDOWS_QUERY).inc,
        expected_rows=partial(sizes.expected_rows, WINDOWS_QUERY),
    )
    if settings.queries == "one":
        job.queries.append(start_single(spark, settings, metrics, checkpoint, sizes, sink))
    else:
        job.queries.extend(start_three(spark, settings, metrics, checkpoint, sizes, sink))
    log.info(
        "transform.started",
        queries=[q.name for q in job.queries],
        master=spark.sparkContext.master,
        checkpoint=checkpoint,
    )
    return job


def start_three(
    spark: SparkSession,
    settings: TransformSettings,
    metrics: TransformMetrics,
    checkpoint: str,
    sizes: BatchSizes,
    sink: WindowSink,
) -> list[StreamingQuery]:
    """The dead-letter, closed-window and open-window queries, each reading the clean topic."""
    queries = []
    dead = (
        dead_letter_records(read_clean_events(spark, settings, headers=True))
        .writeStream.queryName(DEAD_LETTERS_QUERY)
        .format("kafka")
        .options(**kafka_sink_options(settings.kafka))
        .option("topic", settings.dlq_topic)
        .option("checkpointLocation", f"{checkpoint}/{DEAD_LETTERS_QUERY}")
        .trigger(processingTime=f"{settings.dead_letter_trigger_seconds} seconds")
    )
    if settings.async_progress:
        # Offsets and commits are written in the background (Kafka sink only).
        dead = dead.option("asyncProgressTrackingEnabled", "true")
    queries.append(dead.start())
    windows = aggregate(
        read_clean_events(spark, settings, headers=False),
        window_specs(settings),
        settings.watermark_seconds,
    )
    queries.append(
        _windows_query(
            windows,
            ByBatchSize(sink, WINDOWS_QUERY, sizes, settings.interpreted_max_rows),
            f"{checkpoint}/{WINDOWS_QUERY}",
            settings.trigger_seconds,
        )
    )
    if settings.open_windows != "none":
        queries.append(start_open_windows(spark, settings, metrics, checkpoint, sizes))
    return queries


def start_single(
    spark: SparkSession,
    settings: TransformSettings,
    metrics: TransformMetrics,
    checkpoint: str,
    sizes: BatchSizes,
    closed_windows: WindowSink,
) -> StreamingQuery:
    """The closed windows, the open ones and the dead letters from one query
    (``svc_transform.single_query``), named as the closed windows' query
    was, its checkpoint its own: a three-query job's holds another plan."""
    opened = [] if settings.open_windows == "none" else open_window_specs(settings)
    open_sink = None
    if opened:
        open_sink = OpenWindowSink(
            redis=settings.redis,
            online_key_prefix=settings.online_key_prefix,
            online_ttl_seconds=settings.online_ttl_seconds,
            on_written=metrics.windows_out.labels(OPEN_WINDOWS_QUERY).inc,
        )
    sink = KindSink(
        closed_windows=closed_windows,
        open_windows=open_sink,
        kafka_source_options=kafka_source_options(settings.kafka),
        kafka_sink_options=kafka_sink_options(settings.kafka),
        dlq_topic=settings.dlq_topic,
        collect_max_rows=settings.driver_write_max_windows,
    )
    windows = all_windows(
        read_clean_events(spark, settings, headers=False),
        window_specs(settings),
        opened,
        settings.watermark_seconds,
    )
    return _windows_query(
        windows,
        ByBatchSize(sink, WINDOWS_QUERY, sizes, settings.interpreted_max_rows),
        f"{checkpoint}/{SINGLE_QUERY_CHECKPOINT}",
        settings.open_window_trigger_seconds if opened else settings.trigger_seconds,
    )


def _windows_query(
    windows: DataFrame, sink: ByBatchSize, checkpoint: str, interval_seconds: float
) -> StreamingQuery:
    """The query named ``WINDOWS_QUERY`` (append mode), each batch to ``sink``."""
    return (
        windows.writeStream.queryName(WINDOWS_QUERY)
        .outputMode("append")
        .foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{interval_seconds} seconds")
        .start()
    )


def open_window_specs(settings: TransformSettings) -> list[WindowSpec]:
    """The window kinds whose open windows go to the online store."""
    specs = window_specs(settings)
    return specs if settings.open_windows == "all" else specs[:1]


def start_open_windows(
    spark: SparkSession,
    settings: TransformSettings,
    metrics: TransformMetrics,
    checkpoint: str,
    sizes: BatchSizes,
) -> StreamingQuery:
    """The open windows' running aggregates into the online store, every micro-batch.

    Latency-bound, so it runs with one shuffle partition (its state is a few
    rows per entity: one task beats two on scheduling and state commits) and
    in a fair-scheduler pool of its own, so its small jobs take turns with
    the closed-window query's instead of queueing behind them. A query keeps
    the session settings it started with (its own clone; the partitions are
    in its checkpoint too), and its thread the local properties."""
    partitions = spark.conf.get("spark.sql.shuffle.partitions") or str(settings.spark.partitions())
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    context = spark.sparkContext
    context.setLocalProperty("spark.scheduler.pool", OPEN_WINDOWS_QUERY)
    sink = OpenWindowSink(
        redis=settings.redis,
        online_key_prefix=settings.online_key_prefix,
        online_ttl_seconds=settings.online_ttl_seconds,
        on_written=metrics.windows_out.labels(OPEN_WINDOWS_QUERY).inc,
    )
    try:
        return (
            running_windows(
                read_clean_events(spark, settings, headers=False),
                open_window_specs(settings),
                settings.watermark_seconds,
            )
            .writeStream.queryName(OPEN_WINDOWS_QUERY)
            .outputMode("update")
            .foreachBatch(
                ByBatchSize(sink, OPEN_WINDOWS_QUERY, sizes, settings.interpreted_max_rows)
            )
            .option("checkpointLocation", f"{checkpoint}/{OPEN_WINDOWS_QUERY}")
            .trigger(processingTime=f"{settings.open_window_trigger_seconds} seconds")
            .start()
        )
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
        context.setLocalProperty("spark.scheduler.pool", None)  # type: ignore[arg-type]


class ProgressListener(StreamingQueryListener):
    """Counts rows in and late rows dropped, and exports each query's
    consumer lag (``shared.bus.lag``, reader ``svc_transform.<query>``), from
    Spark's progress reports, each read from the JVM as one JSON document
    (``JsonProgressEvents``); gives ``sizes`` each query's batch and lag."""

    def __init__(self, metrics: TransformMetrics, sizes: BatchSizes | None = None) -> None:
        self._metrics = metrics
        self._sizes = sizes if sizes is not None else BatchSizes()
        self._lags: dict[str, ConsumerLag] = {}  # by query id

    @property
    def _jlistener(self) -> Any:
        # pyspark registers what this property gives (StreamingQueryManager.
        # addListener); its own bridge reads each progress field by field.
        if not hasattr(self, "_jlistenerobj"):
            from pyspark import SparkContext

            jvm: Any = SparkContext._jvm
            self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(JsonProgressEvents(self))
        return self._jlistenerobj

    def onQueryStarted(self, event: Any) -> None:
        return None

    def onQueryIdle(self, event: Any) -> None:
        # Idle: the source has nothing past what the query has read.
        lag = self._lags.get(str(event.id))
        if lag is not None:
            for topic, partition in lag.held:
                lag.set(topic, partition, 0)

    def onQueryTerminated(self, event: Any) -> None:
        lag = self._lags.pop(str(event.id), None)
        if lag is not None:
            lag.close()
        if event.exception:
            log.error("query.failed", query_id=str(event.id), error=event.exception)

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        name = progress.name or str(progress.id)
        metrics = self._metrics
        metrics.rows_in.labels(name).inc(progress.numInputRows)
        metrics.batch_seconds.labels(name).set(progress.batchDuration / 1000)
        metrics.busy_seconds.labels(name).inc(progress.batchDuration / 1000)
        log.debug(
            "batch.progress",
            query=name,
            batch=progress.batchId,
            rows=progress.numInputRows,
            durations_ms=progress.durationMs,
        )
        behind_by = self._export_lag(progress, name)
        self._sizes.record(name, progress.numInputRows, behind_by)
        dropped = sum(op.numRowsDroppedByWatermark for op in progress.stateOperators)
        if dropped:
            metrics.late_rows_dropped.labels(name).inc(dropped)
            log.warning(
                "late.dropped",
                query=name,
                batch=progress.batchId,
                rows=dropped,
                watermark=progress.eventTime.get("watermark"),
                offsets=[source.startOffset for source in progress.sources],
            )

    def _export_lag(self, progress: Any, name: str) -> int:
        """Exports the query's lag per partition; its total."""
        query_id = str(progress.id)
        lag = self._lags.get(query_id)
        if lag is None:
            lag = self._lags[query_id] = ConsumerLag(f"{SERVICE}.{name}")
        lags: dict[tuple[str, int], int] = {}
        for source in progress.sources:
            lags.update(offsets_behind(source.endOffset, source.latestOffset))
        for (topic, partition), behind_by in lags.items():
            lag.set(topic, partition, behind_by)
        lag.keep(lags.keys())
        return sum(lags.values())


class JsonProgressEvents(JStreamingQueryListener):
    """The JVM's listener calls into Python (py4j), with each progress report
    read as its JSON document in one call. pyspark's own reads a report
    field by field, a py4j round trip each, and looks up the classes of what
    they return over every jar on the class path: 137 ms of both processes'
    CPU a report against 0.6 ms as JSON (one windowed query's report, on
    the 2-core build machine), with three queries reporting from every half
    second to every few seconds on the cores their batches run on."""

    def onQueryProgress(self, jevent: Any) -> None:
        event = {"progress": json.loads(jevent.progress().json())}
        self.pylistener.onQueryProgress(QueryProgressEvent.fromJson(event))


def offsets_behind(end_offset: str | None, latest_offset: str | None) -> dict[tuple[str, int], int]:
    """A Kafka source's lag per (topic, partition) after a micro-batch: the
    records between where the batch ended (``endOffset``) and the latest the
    source saw (``latestOffset``). Spark's own ``min/avg/maxOffsetsBehindLatest``
    source metrics are these same numbers, aggregated; per partition they
    match what every other reader exports. Empty for a source that is not
    Kafka's or reports no latest offsets."""
    end, latest = _kafka_offsets(end_offset), _kafka_offsets(latest_offset)
    lags: dict[tuple[str, int], int] = {}
    for key, position in end.items():
        lag = behind(latest.get(key, -1), position)
        if lag is not None:
            lags[key] = lag
    return lags


def _kafka_offsets(text: str | None) -> dict[tuple[str, int], int]:
    """The Kafka source's offsets, ``{"topic": {"0": 12}}``, by (topic, partition)."""
    if not text:
        return {}
    try:
        parsed: Any = json.loads(text)
    except ValueError:
        # Progress rebuilt from JSON (Spark Connect's listener) carries the
        # offsets as a Python dict's str(), not as JSON.
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return {}
    offsets: dict[tuple[str, int], int] = {}
    if not isinstance(parsed, Mapping):
        return offsets
    for topic, partitions in parsed.items():
        if not isinstance(partitions, Mapping):
            continue
        for partition, offset in partitions.items():
            if isinstance(offset, int) and str(partition).lstrip("-").isdigit():
                offsets[(str(topic), int(partition))] = offset
    return offsets
