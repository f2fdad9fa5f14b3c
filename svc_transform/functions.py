"""The JVM functions that move aistack.v1 protobuf in and out of Spark rows.

Spark's own ``from_protobuf``/``to_protobuf`` live in the spark-protobuf
module, which Maven Central does not serve for Spark 4 here; these do the
same natively (Java, in the executors, with the classes protoc generates
from the contracts' descriptor set; no Python per row). Sources:
``svc_transform/jvm``; built and cached by
``svc_transform.jars.ensure_functions_jar``.
"""

from __future__ import annotations

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
#: Aggregate: values to a mergeable quantile sketch (Spark's percentile_approx digest).
SKETCH_VALUES = "aistack_sketch_values"
#: Aggregate: sketches to the sketch of all their values.
MERGE_SKETCHES = "aistack_merge_sketches"
#: (sketch, fraction) to the approximate percentile.
SKETCH_PERCENTILE = "aistack_sketch_percentile"
#: Aggregate: records' (topic, partition, offset) to their offset ranges, one per
#: partition (a ``struct<ranges: array<struct<topic, partition, minOffset,
#: maxOffset, count>>>``, sorted by topic and partition).
RECORD_OFFSET_RANGES = "aistack_record_offset_ranges"
#: Aggregate: the ``ranges`` of such results to the ranges of all their records.
MERGE_OFFSET_RANGES = "aistack_merge_offset_ranges"

_PACKAGE = "dev.aistack.transform"


def register(spark: SparkSession) -> None:
    """Make the functions callable in SQL expressions of ``spark``'s queries."""
    udf = spark.udf
    udf.registerJavaFunction(CLEAN_EVENT_ERROR, f"{_PACKAGE}.CleanEventError", StringType())
    udf.registerJavaFunction(ENCODE_FEATURE_WINDOW, f"{_PACKAGE}.EncodeFeatureWindow", BinaryType())
    udf.registerJavaFunction(ENCODE_DEAD_LETTER, f"{_PACKAGE}.EncodeDeadLetter", BinaryType())
    udf.registerJavaFunction(SKETCH_PERCENTILE, f"{_PACKAGE}.SketchPercentile", DoubleType())
    # Aggregators, and functions built with arguments, have no
    # registerJavaFunction: the JVM side registers them.
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("the SparkContext has no JVM (stopped?)")
    jvm.dev.aistack.transform.DecodeObservations.register(
        spark._jsparkSession, DECODE_OBSERVATIONS, WEB_LATENCY, WEB_LATENCY_UNIT
    )
    jvm.dev.aistack.transform.Aggregates.register(
        spark._jsparkSession,
        SKETCH_VALUES,
        MERGE_SKETCHES,
        RECORD_OFFSET_RANGES,
        MERGE_OFFSET_RANGES,
    )
