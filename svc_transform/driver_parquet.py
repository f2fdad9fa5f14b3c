"""A closed-window batch's few windows into the local offline store from the
driver, laid out as Spark's dynamic partition overwrite lays them out.

Spark's own write of a handful of windows is a job of its own (a task, the
commit protocol, a staging directory renamed into place), and the next batch
waits for it: in ``bench.transform_latency`` 0.035-0.040 s of a 0.4 s
micro-batch on a fast day, 0.15-0.55 s of a 0.6-1.1 s one on a slow one.
The driver holds the windows already (``WindowSink`` collects them as Arrow
for Kafka and Redis), and pyarrow writes each partition's file as Spark
would have:

* the same directories (``date=…/metric=…/window=…/batch=…``), each value
  escaped by Spark's own ``ExternalCatalogUtils``;
* the same file schema and footer: Spark's schema of the data columns
  (``org.apache.spark.sql.parquet.row.metadata``, which Spark's reader takes
  the schema from) and no Arrow schema, timestamps in the Parquet type and
  the compression the session names (``ParquetOptions.of``: settings this
  module cannot honour leave the write to Spark);
* the same replacement: the files are written under a staging directory
  (``.aistack-staging-…``: readers skip names starting with a dot) and each
  partition is renamed into place over what an earlier run of the same
  batch left there, so a batch run again never leaves a window twice.

The object store keeps Spark's writer (``WindowSink.to_parquet``).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pyspark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Where Spark's Parquet writer keeps the data columns' Spark schema (JSON).
SPARK_SCHEMA_KEY = "org.apache.spark.sql.parquet.row.metadata"
#: And the version of Spark whose writer wrote the file: a file without one
#: is read as if by another writer, its old dates' calendar per the reader's
#: settings; pyarrow writes Spark 3's (proleptic Gregorian) calendar.
SPARK_VERSION_KEY = "org.apache.spark.version"
STAGING_PREFIX = ".aistack-staging-"

# spark.sql.parquet.compression.codec → pyarrow's name and Spark's file suffix.
_CODECS = {
    "none": ("none", ""),
    "uncompressed": ("none", ""),
    "snappy": ("snappy", ".snappy"),
    "gzip": ("gzip", ".gz"),
    "zstd": ("zstd", ".zstd"),
    "lz4_raw": ("lz4", ".lz4raw"),
}
# spark.sql.parquet.outputTimestampType → pyarrow's options. Spark truncates
# micros to millis; so does this.
_TIMESTAMPS: dict[str, dict[str, Any]] = {
    "INT96": {"use_deprecated_int96_timestamps": True},
    "TIMESTAMP_MICROS": {"coerce_timestamps": "us"},
    "TIMESTAMP_MILLIS": {"coerce_timestamps": "ms", "allow_truncated_timestamps": True},
}


@dataclass(frozen=True)
class ParquetOptions:
    """How the session's Spark would write a Parquet file, in pyarrow's terms."""

    compression: str
    suffix: str
    timestamps: dict[str, Any]

    @classmethod
    def of(cls, conf: Callable[[str, str], str | None]) -> ParquetOptions | None:
        """The options for a session whose settings ``conf(key, default)``
        reads; None where Spark would write what pyarrow does not (the
        legacy format, a Hadoop codec such as LZO or Hadoop's LZ4)."""
        codec = (conf("spark.sql.parquet.compression.codec", "snappy") or "snappy").lower()
        stamps = (conf("spark.sql.parquet.outputTimestampType", "INT96") or "INT96").upper()
        legacy = (conf("spark.sql.parquet.writeLegacyFormat", "false") or "false").lower()
        if codec not in _CODECS or stamps not in _TIMESTAMPS or legacy == "true":
            return None
        compression, suffix = _CODECS[codec]
        return cls(compression, suffix, _TIMESTAMPS[stamps])


def write_batch(
    table: pa.Table,
    root: Path,
    *,
    partition_columns: Sequence[str],
    spark_schema: str,
    options: ParquetOptions,
    partition_path: Callable[[Sequence[str | None]], str],
) -> int:
    """``table``'s rows into ``root``, the data columns (all but
    ``partition_columns``, of string or integer types, whose values name the
    directories) in one file a partition, each partition replaced whole.
    ``spark_schema``: Spark's schema of the data columns (JSON).
    ``partition_path``: a partition's directory by its values, as Spark
    names it. Returns the files written."""
    groups: dict[tuple[str | None, ...], list[int]] = {}
    keys = zip(*(table.column(name).to_pylist() for name in partition_columns), strict=True)
    for index, values in enumerate(keys):
        # Spark's string for a string or an integer is Python's.
        key = tuple(None if value is None else str(value) for value in values)
        groups.setdefault(key, []).append(index)
    files = table.drop_columns(list(partition_columns))
    staging = root / f"{STAGING_PREFIX}{uuid.uuid4().hex}"
    try:
        placed = []
        for values, indices in groups.items():
            relative = partition_path(values)
            folder = staging / relative
            folder.mkdir(parents=True)
            name = f"part-00000-{uuid.uuid4()}.c000{options.suffix}.parquet"
            rows = files.take(pa.array(indices))
            # No Arrow schema beside Spark's own, as in Spark's files.
            with pq.ParquetWriter(
                folder / name,
                rows.schema,
                compression=options.compression,
                store_schema=False,
                **options.timestamps,
            ) as writer:
                writer.write_table(rows)
                writer.add_key_value_metadata(
                    {SPARK_SCHEMA_KEY: spark_schema, SPARK_VERSION_KEY: pyspark.__version__}
                )
            placed.append(relative)
        for relative in placed:
            target = root / relative
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / relative, target)
        return len(placed)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def partition_namer(
    spark: SparkSession, columns: Sequence[str]
) -> Callable[[Sequence[str | None]], str]:
    """A partition's directory (``name=value/…``) by its values, as Spark's
    writer names it: Spark's own escaping, a null or empty value Hive's
    default partition."""
    jvm = spark._jvm
    assert jvm is not None
    names = jvm.org.apache.spark.sql.catalyst.catalog.ExternalCatalogUtils

    def name(values: Sequence[str | None]) -> str:
        return "/".join(
            names.getPartitionPathString(column, value)
            for column, value in zip(columns, values, strict=True)
        )

    return name
