"""The scoring job's input as a Spark DataFrame, without the job Spark runs
to learn its schema.

``spark.read.parquet`` infers a schema by reading one file's footer, the
file it picks (``ParquetUtils.inferSchema``: a ``_common_metadata`` summary,
else a ``_metadata`` one, else the first data file by path), but always in a
Spark job of its own (``SchemaMergeUtils.mergeSchemasInParallel``): on the
2-core build machine 0.11-0.21 s of a 1.0-1.5 s scoring job. The driver
here reads that same footer itself, through the JVM, converts it with
Spark's own converter (``ParquetFileFormat.readSchemaFromFooter`` with the
session's ``ParquetToSparkSchemaConverter``: the Spark schema a Spark
writer kept in the footer, else the Parquet types converted under the
session's settings) and hands it to ``spark.read.schema``, which still
infers the Hive partition columns from the paths as the plain read does:
0.06-0.09 s.

Where the session merges schemas (``spark.sql.parquet.mergeSchema``), or
no file or footer can be read here, it is ``spark.read.parquet`` itself,
and so are its errors.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from shared import object_store as stores
from shared.settings import ObjectStoreSettings

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pyspark.sql import DataFrame, SparkSession

#: Parquet's summary files, in the order Spark prefers them for a schema.
SUMMARY_FILES = ("_common_metadata", "_metadata")
_MERGE_SCHEMA = "spark.sql.parquet.mergeSchema"


def read_parquet(spark: SparkSession, url: str, settings: ObjectStoreSettings) -> DataFrame:
    """``spark.read.parquet`` of ``url`` (a path, or a URL on the store
    ``settings`` describes: read as ``s3a://``), its schema read on the
    driver from the footer Spark would infer it from."""
    hadoop = stores.hadoop_url(url)
    if (spark.conf.get(_MERGE_SCHEMA, "false") or "false").lower() == "true":
        return spark.read.parquet(hadoop)
    try:
        chosen = schema_file(_listed(url, settings))
        schema = None if chosen is None else footer_schema(spark, chosen)
    except Exception:  # Spark's own read says what is wrong, below
        schema = None
    if schema is None:
        return spark.read.parquet(hadoop)
    return spark.read.schema(schema).parquet(hadoop)


def schema_file(files: Iterable[str]) -> str | None:
    """Of the leaf files Spark lists under an input (``files``, as
    ``spark_leaf``), the one its schema inference reads without
    ``mergeSchema``: a ``_common_metadata``, else a ``_metadata``, else the
    first data file by path; None for none."""
    ordered = sorted(files)
    for summary in SUMMARY_FILES:
        for name in ordered:
            if _name(name) == summary:
                return name
    return next((name for name in ordered if _name(name) not in SUMMARY_FILES), None)


def spark_leaf(relative: str) -> bool:
    """Whether Spark's file listing keeps a file at ``relative`` (its path
    under the input, ``/``-separated): no part of it hidden (a name starting
    with ``.``, or with ``_`` and holding no ``=``, other than Parquet's
    summary files) and no ``._COPYING_`` file (``HadoopFSUtils.shouldFilterOutPathName``)."""
    for part in relative.split("/"):
        if part.startswith(SUMMARY_FILES):
            continue
        hidden = part.startswith(".") or (part.startswith("_") and "=" not in part)
        if hidden or part.endswith("._COPYING_"):
            return False
    return True


def footer_schema(spark: SparkSession, file_url: str) -> Any:
    """The Spark schema (a ``StructType``) Spark's inference gives
    ``file_url`` (a Hadoop URL: ``file:/…``, ``s3a://…``)."""
    from pyspark.sql.types import StructType

    # Spark's converter lives in the JVM only.
    jvm: Any = spark._jvm
    session: Any = spark._jsparkSession
    parquet = jvm.org.apache.parquet.hadoop
    path = jvm.org.apache.hadoop.fs.Path(file_url)
    state = session.sessionState()
    reader = parquet.ParquetFileReader.open(
        parquet.util.HadoopInputFile.fromPath(path, state.newHadoopConf())
    )
    try:
        footer = reader.getFooter()
    finally:
        reader.close()
    formats = jvm.org.apache.spark.sql.execution.datasources.parquet
    converter = formats.ParquetToSparkSchemaConverter(state.conf())
    schema = formats.ParquetFileFormat.readSchemaFromFooter(parquet.Footer(path, footer), converter)
    return StructType.fromJson(json.loads(schema.json()))


def _listed(url: str, settings: ObjectStoreSettings) -> list[str]:
    """The leaf files under ``url`` Spark lists, as Hadoop URLs."""
    fs, root = stores.filesystem(stores.fsspec_url(url), settings)
    if fs.isfile(root):
        found = [root]
    else:
        prefix = root.rstrip("/") + "/"
        found = [
            path
            for path in fs.find(root)
            # S3A's directory markers (``dir/``) are not files.
            if path.startswith(prefix)
            and not path.endswith("/")
            and spark_leaf(path[len(prefix) :])
        ]
    if stores.is_object_url(url):
        return [f"s3a://{path}" for path in found]
    return [f"file:{path}" for path in found]


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]
