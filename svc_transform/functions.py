"""The JVM functions that move aistack.v1 protobuf in and out of Spark rows.

Spark's own ``from_protobuf``/``to_protobuf`` live in the spark-protobuf
module, which Maven Central does not serve for Spark 4 here; these do the
same natively (Java, in the executors, with the classes protoc generates
from the contracts' descriptor set; no Python per row). Sources:
``svc_transform/jvm``; built and cached by
``svc_transform.jars.ensure_functions_jar``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, DoubleType, StringType

from shared.feature_store import WEB_LATENCY

#: CleanEvent bytes to its observations, each a ``struct<entity_id, event_time,
#: metric, path, unit, value, is_error>`` (none when it does not decode).
DECODE_OBSERVATIONS = "aistack_decode_observations"
#: A web request's latency, as an observation's unit.
WEB_LATENCY_UNIT = "ms"
#: Why a record is not a usable CleanEvent (null when it is).
CLEAN_EVENT_ERROR = "aistack_clean_event_error"
ENCODE_FEATURE_WINDOW = "aistack_encode_feature_window"
ENCODE_DEAD_LETTER = "aistack_encode_dead_letter"
#: Aggregate: quantile sketches (exact counts of up to 2,048 distinct values,
#: else Spark's percentile_approx digest, as ``summarise_panes`` makes them)
#: to the sketch of all their values.
MERGE_SKETCHES = "aistack_merge_sketches"
#: (sketch, fraction) to the approximate percentile.
SKETCH_PERCENTILE = "aistack_sketch_percentile"
#: Aggregate: offset ranges (``ranges``: ``array<struct<topic, partition,
#: minOffset, maxOffset, count>>``, one per partition) to the ranges of all
#: their records (``struct<ranges: ...>``, sorted by topic and partition).
MERGE_OFFSET_RANGES = "aistack_merge_offset_ranges"

_PACKAGE = "dev.aistack.transform"

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def register(spark: SparkSession) -> None:
    """Make the functions callable in SQL expressions of ``spark``'s queries."""
    udf = spark.udf
    udf.registerJavaFunction(CLEAN_EVENT_ERROR, f"{_PACKAGE}.CleanEventError", StringType())
    udf.registerJavaFunction(ENCODE_FEATURE_WINDOW, f"{_PACKAGE}.EncodeFeatureWindow", BinaryType())
    udf.registerJavaFunction(ENCODE_DEAD_LETTER, f"{_PACKAGE}.EncodeDeadLetter", BinaryType())
    udf.registerJavaFunction(SKETCH_PERCENTILE, f"{_PACKAGE}.SketchPercentile", DoubleType())
    # Aggregators, and functions built with arguments, have no
    # registerJavaFunction: the JVM side registers them.
    jvm = _jvm(spark)
    jvm.dev.aistack.transform.DecodeObservations.register(
        spark._jsparkSession, DECODE_OBSERVATIONS, WEB_LATENCY, WEB_LATENCY_UNIT
    )
    jvm.dev.aistack.transform.Aggregates.register(
        spark._jsparkSession, MERGE_SKETCHES, MERGE_OFFSET_RANGES
    )


def summarise_panes(records: DataFrame, pane_seconds: int) -> DataFrame:
    """Kafka records of clean events (``value``, ``topic``, ``partition``,
    ``offset``) to each task's summary per (pane, entity, metric, path, unit)
    of their observations: a pane's ``window``, the dimensions, ``n``,
    ``mean``, ``m2``, ``min``, ``max``, ``last``, ``last_event_time``,
    ``sketch``, ``errors``, ``error_n``, ``sources`` and ``event_time`` (its
    latest event's), in one pass of the JVM's (``PaneSummaries``); records
    that are not usable CleanEvents give nothing."""
    from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

    session = records.sparkSession
    summarise = _jvm(session).dev.aistack.transform.PaneSummaries.summarise
    return ClassicFrame(
        summarise(records._jdf, pane_seconds, WEB_LATENCY, WEB_LATENCY_UNIT), session
    )


def _jvm(spark: SparkSession) -> Any:
    """``spark``'s JVM gateway view."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("the SparkContext has no JVM (stopped?)")
    return jvm
