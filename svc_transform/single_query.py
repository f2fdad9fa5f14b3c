"""svc_transform as one streaming query (``AISTACK_TRANSFORM_QUERIES=one``).

One read of the clean topic; each task summarises its records per pane
(``PaneSummaries``) and keeps those that do not decode; one stateful
operator in the JVM (``WindowState``) keeps each series' panes and gives,
per micro-batch, the open windows its summaries changed, the windows the
watermark closed and the rejected records, each row tagged by ``kind``; the
batch's sink hands each kind to its store. Three queries (the closed
windows, the open ones, the dead letters) each read and parsed every
record and paid a micro-batch's fixed cost on the same two cores.
"""

from __future__ import annotations

import json
import time
from functools import cached_property
from typing import TYPE_CHECKING

import pyarrow.compute as pc
from pyspark.sql import functions as F

from shared.feature_store import WEB_LATENCY
from svc_transform.functions import WEB_LATENCY_UNIT
from svc_transform.sinks import (
    OpenWindow,
    OpenWindowSink,
    WindowSink,
    any_window_columns,
    rows_of,
    undecodable_letters,
)
from svc_transform.windows import (
    WindowSpec,
    feature_window_bytes,
    finish_columns,
    pane_seconds,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: A row's ``kind`` (``WindowState``'s).
CLOSED, OPEN, REJECTED = "closed", "open", "rejected"


def all_windows(
    records: DataFrame, specs: list[WindowSpec], open_specs: list[WindowSpec], watermark: int
) -> DataFrame:
    """Kafka records of clean events (read with headers or without) to ``WindowState``'s
    rows: every closed window of ``specs``, the changed open ones of
    ``open_specs``, the records that are not usable CleanEvents."""
    from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

    session = records.sparkSession
    jvm = session.sparkContext._jvm
    assert jvm is not None  # a running session's
    spec_text = ";".join(
        f"{s.size_seconds}:{s.slide_seconds}:{s.name}:{int(s in open_specs)}" for s in specs
    )
    windows = jvm.dev.aistack.transform.WindowState.windows(
        records._jdf, spec_text, pane_seconds(specs), watermark, WEB_LATENCY, WEB_LATENCY_UNIT
    )
    return ClassicFrame(windows, session)


def with_headers(rejected: DataFrame, kafka_source_options: dict[str, str]) -> DataFrame:
    """``rejected`` rows' records (``undecodable_letters``' columns) with
    their headers, read again from Kafka: the query reads without them (a
    tenth of its read for every record, where only a rejected one needs
    them); a few records, once each."""
    record = F.col(REJECTED)
    positions = rejected.select(
        record["topic"].alias("topic"),
        record["partition"].alias("partition"),
        record["offset"].alias("offset"),
    ).collect()
    spans: dict[str, dict[str, list[int]]] = {}
    for topic, partition, offset in positions:
        span = spans.setdefault(topic, {}).setdefault(str(partition), [offset, offset])
        span[0], span[1] = min(span[0], offset), max(span[1], offset)

    def offsets(end: int, past: int) -> str:
        return json.dumps(
            {t: {p: span[end] + past for p, span in ps.items()} for t, ps in spans.items()}
        )

    read = (
        rejected.sparkSession.read.format("kafka")
        .options(**kafka_source_options)
        .option("assign", json.dumps({t: [int(p) for p in ps] for t, ps in spans.items()}))
        .option("startingOffsets", offsets(0, 0))
        .option("endingOffsets", offsets(1, 1))
        .option("includeHeaders", "true")
        .load()
        .select("topic", "partition", "offset", F.col("headers").alias("read_headers"))
    )
    flat = rejected.select(f"{REJECTED}.*").drop("headers")
    joined = flat.join(read, ["topic", "partition", "offset"], "left")
    return joined.withColumnRenamed("read_headers", "headers")


class KindSink:
    """``foreachBatch`` target of the single query: the open windows to
    ``open_windows`` (first: the online store's freshness waits on it), the
    closed ones to ``closed_windows``, the rejected records to the
    dead-letter topic.

    A batch expected to give at most ``collect_max_rows`` rows (the last
    batch gave no more; 0: none) is computed and collected by one job, every kind at
    once, and the driver writes each to its stores: a job of its own for each
    kind (a count of them, the open windows' collect, the closed ones') took
    two thirds of a second's batch on the build machine. A batch after a
    larger one, or the first (after downtime: a backlog), is cached, counted
    by kind, and each kind written by its sink's Spark jobs. The rows are
    windows, not records: a batch of a hundred thousand readings from a
    thousand series gives a few thousand.
    """

    def __init__(
        self,
        *,
        closed_windows: WindowSink,
        open_windows: OpenWindowSink | None,
        kafka_source_options: dict[str, str],
        kafka_sink_options: dict[str, str],
        dlq_topic: str,
        collect_max_rows: int,
    ) -> None:
        self._collect_max_rows = collect_max_rows
        # Rows (every kind) of the last batch; None before the first.
        self._last_rows: int | None = None
        self._closed = closed_windows
        self._open = open_windows
        self._kafka_source_options = kafka_source_options
        self._kafka_sink_options = kafka_sink_options
        self._dlq_topic = dlq_topic

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            last, most = self._last_rows, self._collect_max_rows
            if most > 0 and last is not None and last <= most:
                self._last_rows = self._write_collected(batch, batch_id)
            else:
                self._last_rows = self._write_by_kind(batch, batch_id)
        finally:
            batch.unpersist()

    @cached_property
    def _finished(self) -> list[Column | str]:
        """A batch's rows as the sinks read them (``finish``'s, ``kind`` first)."""
        return finish_columns("kind")

    @cached_property
    def _collected(self) -> list[Column | str]:
        """``_finished`` rows, every kind, as the driver writes them."""
        kind = F.col("kind")
        value = F.when(kind == OPEN, feature_window_bytes(open_window=True)).when(
            kind == CLOSED, feature_window_bytes()
        )
        return ["kind", *any_window_columns(value)]

    def _write_collected(self, batch: DataFrame, batch_id: int) -> int:
        """Writes the batch from one collect; its rows."""
        started = time.perf_counter()
        finished = batch.select(*self._finished)
        table = finished.select(*self._collected).toArrow()
        seconds = {"aggregate_s": round(time.perf_counter() - started, 3)}
        kinds = table.column("kind")
        opened = table.filter(pc.equal(kinds, OPEN))
        if opened.num_rows and self._open is not None:
            self._open.write(rows_of(opened, OpenWindow))
        closed = table.filter(pc.equal(kinds, CLOSED))
        if closed.num_rows:
            # Its schema, and Spark's write where the driver does not write the files.
            closed_frame = _of_kind(finished, CLOSED)
            self._closed.write_collected(closed_frame, closed, batch_id, seconds, started)
        if pc.any(pc.equal(kinds, REJECTED)).as_py():
            self._dead_letters(batch.where(F.col("kind") == REJECTED))
        return int(table.num_rows)

    def _write_by_kind(self, batch: DataFrame, batch_id: int) -> int:
        """Writes each kind by its sink's jobs; the batch's rows."""
        # One job computes the batch into its cache; each kind reads it there.
        kinds = {row[0]: row[1] for row in batch.groupBy("kind").count().collect()}
        finished = batch.select(*self._finished)
        if kinds.get(OPEN) and self._open is not None:
            self._open(_of_kind(finished, OPEN), batch_id)
        if kinds.get(CLOSED):
            self._closed(_of_kind(finished, CLOSED), batch_id)
        if kinds.get(REJECTED):
            self._dead_letters(batch.where(F.col("kind") == REJECTED))
        return int(sum(kinds.values()))

    def _dead_letters(self, rejected: DataFrame) -> None:
        (
            undecodable_letters(with_headers(rejected, self._kafka_source_options))
            .write.format("kafka")
            .options(**self._kafka_sink_options)
            .option("topic", self._dlq_topic)
            .save()
        )


def _of_kind(finished: DataFrame, kind: str) -> DataFrame:
    """``finished`` rows (``KindSink._finished``) of one kind, as its sink reads them."""
    return finished.where(F.col("kind") == kind).drop("kind")
