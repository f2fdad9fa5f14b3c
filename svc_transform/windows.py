"""Clean events to event-time window aggregates, as Spark column expressions.

Every function takes and returns a DataFrame and works the same on a stream
and on a static frame, so the arithmetic is tested without Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from svc_transform.functions import DECODE_CLEAN_EVENT, ENCODE_FEATURE_WINDOW

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from svc_transform.settings import TransformSettings

#: The metric of web requests; the request path is its one dimension.
WEB_LATENCY = "http.latency_ms"
#: Accuracy of percentile_approx: relative error about 1/10000.
PERCENTILE_ACCURACY = 10_000


@dataclass(frozen=True)
class WindowSpec:
    size_seconds: int
    slide_seconds: int

    @property
    def name(self) -> str:
        if self.slide_seconds == self.size_seconds:
            return f"tumbling-{self.size_seconds}s"
        return f"sliding-{self.size_seconds}s-every-{self.slide_seconds}s"


def window_specs(settings: TransformSettings) -> list[WindowSpec]:
    size = settings.tumbling_window_seconds
    specs = [WindowSpec(size, size)]
    if settings.sliding_window_seconds:
        specs.append(WindowSpec(settings.sliding_window_seconds, settings.sliding_slide_seconds))
    return specs


def decode(records: DataFrame) -> DataFrame:
    """Kafka records plus ``event``: the decoded CleanEvent (``event.error`` when it is not one)."""
    # Through a one-element explode, so the decode runs once per record: as a
    # plain column, Spark would inline the call into every later reference.
    decoded = F.explode(F.array(F.expr(f"{DECODE_CLEAN_EVENT}(value)")))
    return records.select("*", decoded.alias("event"))


def observations(decoded: DataFrame) -> DataFrame:
    """One row per (entity, metric, path) value: sensor measurements and web latencies."""
    event = F.col("event")
    sensor_values = F.transform(
        event["measurements"],
        lambda m: F.struct(
            m["metric"].alias("metric"),
            F.lit("").alias("path"),
            m["unit"].alias("unit"),
            m["value"].alias("value"),
            F.lit(None).cast("double").alias("is_error"),
        ),
    )
    web = event["web"]
    web_value = F.array(
        F.struct(
            F.lit(WEB_LATENCY).alias("metric"),
            web["path"].alias("path"),
            F.lit("ms").alias("unit"),
            web["latency_ms"].alias("value"),
            (web["status"] >= 500).cast("double").alias("is_error"),
        )
    )
    # One pass over the events (a union would decode each twice).
    values = F.when(event["kind"] == "sensor", sensor_values).otherwise(web_value)
    return (
        decoded.where(event["error"].isNull())
        .select(
            event["entity_id"].alias("entity_id"),
            event["event_time"].alias("event_time"),
            F.explode(values).alias("o"),
        )
        .select("entity_id", "event_time", "o.*")
    )


def aggregate(observed: DataFrame, spec: WindowSpec, watermark_seconds: int) -> DataFrame:
    """Window aggregates; on a stream a window is emitted once the watermark passes its end."""
    window = F.window("event_time", f"{spec.size_seconds} seconds", f"{spec.slide_seconds} seconds")
    stats = (
        observed.withWatermark("event_time", f"{watermark_seconds} seconds")
        .groupBy(window.alias("window"), "entity_id", "metric", "path", "unit")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.avg("value").alias("mean"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            # Sample standard deviation, as pandas and Spark's stddev; 0 for one value.
            F.coalesce(F.stddev_samp("value"), F.lit(0.0)).alias("stddev"),
            F.max_by("value", "event_time").alias("last"),
            F.percentile_approx(
                "value", F.array(F.lit(0.5), F.lit(0.95)), PERCENTILE_ACCURACY
            ).alias("percentiles"),
            F.avg("is_error").alias("error_rate"),
            F.max("event_time").alias("last_event_time"),
        )
    )
    start = F.col("window.start")
    return stats.select(
        _window_key(spec).alias("window_key"),
        "entity_id",
        "metric",
        "path",
        "unit",
        start.alias("window_start"),
        F.col("window.end").alias("window_end"),
        F.lit(spec.size_seconds).cast("long").alias("window_size"),
        F.lit(spec.slide_seconds).cast("long").alias("window_slide"),
        "count",
        "mean",
        "min",
        "max",
        "stddev",
        "last",
        F.col("percentiles")[0].alias("p50"),
        F.col("percentiles")[1].alias("p95"),
        "error_rate",
        "last_event_time",
        F.date_format(start, "yyyy-MM-dd").alias("date"),
    )


def _window_key(spec: WindowSpec) -> Column:
    # The same (entity, metric, dimensions, start, size, slide) always gets the same key.
    return F.substring(
        F.sha2(
            F.concat_ws(
                "|",
                F.col("entity_id"),
                F.col("metric"),
                F.col("path"),
                F.col("window.start").cast("long").cast("string"),
                F.lit(str(spec.size_seconds)),
                F.lit(str(spec.slide_seconds)),
            ),
            256,
        ),
        1,
        32,
    )


def feature_window_bytes() -> Column:
    """An aggregate row (``aggregate``'s columns) as aistack.v1.FeatureWindow bytes."""
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
    )
    return F.call_udf(ENCODE_FEATURE_WINDOW, struct)
