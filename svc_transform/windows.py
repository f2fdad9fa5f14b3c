"""Clean events to event-time window aggregates, as Spark column expressions.

Every function takes and returns a DataFrame and works the same on a stream
and on a static frame, so the arithmetic is tested without Kafka.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from shared.feature_store import DIMENSIONS, window_kind

# The metric observations give web requests' latencies (registered with the JVM function).
from shared.feature_store import WEB_LATENCY as WEB_LATENCY
from svc_transform.functions import (
    DECODE_OBSERVATIONS,
    ENCODE_FEATURE_WINDOW,
    MERGE_OFFSET_RANGES,
    MERGE_SKETCHES,
    SKETCH_PERCENTILE,
    summarise_panes,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, GroupedData

    from svc_transform.settings import TransformSettings


@dataclass(frozen=True)
class WindowSpec:
    size_seconds: int
    slide_seconds: int

    @property
    def name(self) -> str:
        return window_kind(self.size_seconds, self.slide_seconds)


def window_specs(settings: TransformSettings) -> list[WindowSpec]:
    size = settings.tumbling_window_seconds
    specs = [WindowSpec(size, size)]
    if settings.sliding_window_seconds:
        specs.append(WindowSpec(settings.sliding_window_seconds, settings.sliding_slide_seconds))
    return specs


def decode(records: DataFrame) -> DataFrame:
    """Kafka records plus ``observed``: their CleanEvents' observations (none
    for a record that is not a usable CleanEvent; the dead-letter query says
    why)."""
    return records.select("*", F.expr(f"{DECODE_OBSERVATIONS}(value)").alias("observed"))


def observations(decoded: DataFrame) -> DataFrame:
    """One row per (entity, metric, path) value: sensor measurements and web
    latencies (metric ``WEB_LATENCY`` in ms, the path its dimension,
    ``is_error`` 1.0 for a status of 500 or more), each with its clean
    event's Kafka ``topic``, ``partition`` and ``offset``. svc_ingest rejects
    a reading that names a metric twice, so an event gives a (metric, path)
    one value at most. The windows read the same observations without
    these rows (``summarise_panes``: the JVM's one place that makes them);
    this is their Spark SQL view."""
    return decoded.select(*_POSITION, F.explode("observed").alias("o")).select(
        "o.entity_id",
        "o.event_time",
        *_POSITION,
        "o.metric",
        "o.path",
        "o.unit",
        "o.value",
        "o.is_error",
    )


#: Where a clean event sat on the clean topic (Spark's Kafka source columns).
_POSITION = ("topic", "partition", "offset")


def pane_seconds(specs: list[WindowSpec]) -> int:
    """The largest time slice every window of every spec is made of whole."""
    return math.gcd(*[n for spec in specs for n in (spec.size_seconds, spec.slide_seconds)])


def aggregate(records: DataFrame, specs: list[WindowSpec], watermark_seconds: int) -> DataFrame:
    """Every spec's window aggregates of Kafka ``records`` of clean events
    (``value``, ``topic``, ``partition``, ``offset``; their observations as
    ``observations`` gives them), from one read of the events (``window``
    names the spec); on a stream a window is emitted once the watermark passes
    its end.

    Events are summarised once per pane (``pane_seconds``) with mergeable
    statistics: count, mean and sum of squared deviations, min, max, last,
    a quantile sketch, and per partition of the clean topic the least and
    greatest offset and the count of the events (``sources``: exact, and one
    entry per partition, whatever the number of events). Each task summarises
    its own records in one pass (``summarise_panes``) and the stateful
    aggregation merges the tasks' summaries into panes; windows merge their
    panes, so a 5-minute window sliding every minute reads five pane summaries
    instead of every event five times. With a single spec as long as its
    pane, panes are the windows.
    """
    pane = WindowSpec(pane_seconds(specs), pane_seconds(specs))
    panes = _merged(
        _pane_summaries(records, pane, watermark_seconds).groupBy("window", *DIMENSIONS)
    )
    if specs == [pane]:
        return finish(panes.select("*", *_spec_columns(pane)))
    return finish(_merged(_group_into_windows(_pane_starts(panes), specs, watermark_seconds)))


def running_windows(
    records: DataFrame, specs: list[WindowSpec], watermark_seconds: int
) -> DataFrame:
    """Every spec's window aggregates as they stand, ``aggregate``'s columns:
    in Spark's update output mode each micro-batch emits the windows its
    events changed, open ones included (the online store's running windows).

    One stateful aggregation of the tasks' pane summaries straight into
    windows: update mode runs a single stateful operator, and a summary goes
    to each window that holds its pane (five with the default sliding spec).
    The statistics are ``aggregate``'s, so a window that closes reads the
    same in both."""
    pane = WindowSpec(pane_seconds(specs), pane_seconds(specs))
    summaries = _pane_summaries(records, pane, watermark_seconds)
    return finish(_merged(_group_into_windows(_pane_starts(summaries), specs, watermark_seconds)))


def _pane_summaries(records: DataFrame, pane: WindowSpec, watermark_seconds: int) -> DataFrame:
    """``summarise_panes``: each task's summaries of its records' observations
    per pane, the stream's watermark on their ``event_time`` and the pane's
    ``window`` carrying it (``_event_time_window``)."""
    summaries = summarise_panes(records, pane.size_seconds).withWatermark(
        "event_time", f"{watermark_seconds} seconds"
    )
    return summaries.select(
        *[c for c in summaries.columns if c != "window"],
        _event_time_window(F.col("window"), watermark_seconds),
    )


def _pane_starts(panes: DataFrame) -> DataFrame:
    """``panes`` with ``pane_start``, the time their windows are found by."""
    return panes.select("*", F.col("window.start").alias("pane_start"))


def _merged(grouped: GroupedData) -> DataFrame:
    """The summaries of each group merged into one (``_pane_summaries``' statistics)."""
    # Chan et al.: squared deviations about the merged mean, from each part's
    # (n, mean, m2); sum(m2 + n * mean^2) - n_total * mean_total^2.
    merged = grouped.agg(
        F.sum("n").alias("n"),
        F.sum(F.col("n") * F.col("mean")).alias("total"),
        F.sum(F.col("m2") + F.col("n") * F.col("mean") * F.col("mean")).alias("squares"),
        F.min("min").alias("min"),
        F.max("max").alias("max"),
        F.max_by("last", "last_event_time").alias("last"),
        F.max("last_event_time").alias("last_event_time"),
        F.expr(f"{MERGE_SKETCHES}(sketch)").alias("sketch"),
        F.sum("errors").alias("errors"),
        F.sum("error_n").alias("error_n"),
        F.expr(f"{MERGE_OFFSET_RANGES}(sources.ranges)").alias("sources"),
    )
    mean = F.col("total") / F.col("n")
    return merged.select(
        "*",
        mean.alias("mean"),
        F.greatest(F.col("squares") - F.col("n") * mean * mean, F.lit(0.0)).alias("m2"),
    )


def _group_into_windows(
    frame: DataFrame, specs: list[WindowSpec], watermark_seconds: int
) -> GroupedData:
    """``frame`` grouped by (window, spec, entity, metric, path, unit); a row
    goes to every window of every spec that holds its ``pane_start``."""
    time_column = "pane_start"
    # A pane's own window makes way for the windows it goes to.
    kept = [c for c in frame.columns if c != "window"]
    if len(specs) == 1 and specs[0].size_seconds == specs[0].slide_seconds:
        # One window holds each row: plain arithmetic, no array of candidate
        # windows to build, filter and explode (the open-window query runs
        # this per observation).
        (spec,) = specs
        windowed = frame.select(
            *kept,
            _event_time_window(_tumbling_window(time_column, spec), watermark_seconds),
            F.struct(*_spec_columns(spec)).alias("w"),
        )
    else:
        windowed = frame.select(
            *kept,
            F.explode(_windows_holding(time_column, specs)).alias("w"),
        ).select("*", _event_time_window(F.struct("w.start", "w.end"), watermark_seconds))
    return windowed.groupBy("window", "w.size", "w.slide", "w.name", *DIMENSIONS)


def _tumbling_window(time_column: str, spec: WindowSpec) -> Column:
    """The window [start, end) of the tumbling ``spec`` that holds ``time_column``."""
    size = spec.size_seconds * 1_000_000
    micros = F.unix_micros(time_column)
    start = micros - F.pmod(micros, F.lit(size))
    return F.struct(
        F.timestamp_micros(start).alias("start"),
        F.timestamp_micros(start + size).alias("end"),
    )


def _spec_columns(spec: WindowSpec) -> list[Column]:
    """``size``, ``slide`` and ``name``: which spec a window is of."""
    return [
        F.lit(spec.size_seconds).cast("long").alias("size"),
        F.lit(spec.slide_seconds).cast("long").alias("slide"),
        F.lit(spec.name).alias("name"),
    ]


def _event_time_window(start_end: Column, watermark_seconds: int) -> Column:
    """``start_end`` as the ``window`` column a streaming aggregation can group by."""
    # What Spark's own window() does: the window column carries the event
    # time's watermark delay, so state is dropped (and late rows too) once the
    # watermark passes the window's end (its second field).
    return start_end.alias("window", metadata={_WATERMARK_DELAY_KEY: watermark_seconds * 1000})


def finish(windows: DataFrame, *keep: str) -> DataFrame:
    """Merged window statistics to the columns the sinks write, the ``keep``
    columns first, as they are."""
    return windows.select(*finish_columns(*keep))


def finish_columns(*keep: str) -> list[Column | str]:
    """``finish``'s columns: built once, they serve every micro-batch (building
    them took 50-70 ms of calls into the JVM, a tenth of a peak batch)."""
    start = F.col("window.start")
    n = F.col("n")
    return [
        *keep,
        _window_key().alias("window_key"),
        "entity_id",
        "metric",
        "path",
        "unit",
        start.alias("window_start"),
        F.col("window.end").alias("window_end"),
        F.col("size").alias("window_size"),
        F.col("slide").alias("window_slide"),
        n.alias("count"),
        "mean",
        "min",
        "max",
        # Sample standard deviation, as pandas and Spark's stddev; 0 for one value.
        F.when(n > 1, F.sqrt(F.col("m2") / (n - 1))).otherwise(F.lit(0.0)).alias("stddev"),
        "last",
        F.call_udf(SKETCH_PERCENTILE, "sketch", F.lit(0.5)).alias("p50"),
        F.call_udf(SKETCH_PERCENTILE, "sketch", F.lit(0.95)).alias("p95"),
        (F.col("errors") / F.col("error_n")).alias("error_rate"),
        "last_event_time",
        F.date_format(start, "yyyy-MM-dd").alias("date"),
        F.col("name").alias("window"),
        _offset_ranges(F.col("sources.ranges")).alias("sources"),
    ]


def _offset_ranges(ranges: Column) -> Column:
    """The aggregators' offset ranges under aistack.v1.OffsetRange's field names."""
    return F.transform(
        ranges,
        lambda r: F.struct(
            r["topic"].alias("topic"),
            r["partition"].alias("partition"),
            r["minOffset"].alias("min_offset"),
            r["maxOffset"].alias("max_offset"),
            r["count"].alias("count"),
        ),
    )


#: Spark's column-metadata key for an event time's watermark delay
#: (``EventTimeWatermark.delayKey``).
_WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"


def _windows_holding(time_column: str, specs: list[WindowSpec]) -> Column:
    """The windows [start, end) of every spec that hold ``time_column``, as
    Spark's window() computes them (epoch-aligned, no start offset)."""
    micros = F.unix_micros(time_column)
    windows = []
    for spec in specs:
        size, slide = spec.size_seconds * 1_000_000, spec.slide_seconds * 1_000_000
        latest_start = micros - F.pmod(micros, F.lit(slide))
        for k in range(-(-size // slide)):
            start = latest_start - k * slide
            windows.append(
                F.struct(
                    F.timestamp_micros(start).alias("start"),
                    F.timestamp_micros(start + size).alias("end"),
                    *_spec_columns(spec),
                    (micros < start + size).alias("holds"),
                )
            )
    return F.filter(F.array(*windows), lambda w: w["holds"])


def _window_key() -> Column:
    # The same (entity, metric, dimensions, start, size, slide) always gets the same key.
    return F.substring(
        F.sha2(
            F.concat_ws(
                "|",
                F.col("entity_id"),
                F.col("metric"),
                F.col("path"),
                F.col("window.start").cast("long").cast("string"),
                F.col("size").cast("string"),
                F.col("slide").cast("string"),
            ),
            256,
        ),
        1,
        32,
    )


def feature_window_bytes(*, open_window: bool = False) -> Column:
    """An aggregate row (``aggregate``'s columns) as aistack.v1.FeatureWindow
    bytes; ``open_window`` marks a running aggregate (``FeatureWindow.open``)."""
    dimensions = F.when(F.col("path") != "", F.create_map(F.lit("path"), F.col("path")))
    struct = F.struct(
        "window_key",
        "entity_id",
        "metric",
        dimensions.alias("dimensions"),
        "window_start",
        "window_end",
        "window_size",
        "window_slide",
        "unit",
        "count",
        "mean",
        "min",
        "max",
        "stddev",
        "last",
        "p50",
        "p95",
        "error_rate",
        "last_event_time",
        "sources",
        F.lit(open_window).alias("open"),
    )
    return F.call_udf(ENCODE_FEATURE_WINDOW, struct)
