"""svc_transform's SparkSession: the shared session with its own jars (the
Kafka connector, protobuf-java, the S3A connector, its JVM functions), its
driver's class path (Hadoop's local filesystem without a process per file)
and functions registered."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from shared import spark_session
from shared.settings import ObjectStoreSettings, SparkSettings
from svc_transform import class_archive as archive
from svc_transform import jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def session(
    spark: SparkSettings,
    app_name: str,
    *,
    cache_dir: os.PathLike[str],
    work_dir: os.PathLike[str],
    class_archive: bool = True,
    object_store: ObjectStoreSettings | None = None,
) -> SparkSession:
    """Start (or join) the session with the connectors and our functions from
    the local cache (no network at start-up), its driver JVM mapping the
    class archive where ``make setup`` built one; with ``object_store``,
    ``s3a://`` reaches that store (``shared.spark_session.session``)."""
    from svc_transform import functions

    cache = Path(cache_dir)
    session_jars = jars.session_jars(cache)
    conf = {
        # Fair scheduling: the open-window query's small jobs take turns with
        # the closed-window query's (svc_transform.job.start_open_windows).
        "spark.scheduler.mode": "FAIR",
        **spark.conf,
    }
    conf |= jars.local_filesystem_conf(jars.ensure_driver_jar(cache), conf, local=spark.is_local())
    if class_archive:
        conf = archive.session_conf(conf, cache, jars.ensure_functions_jar(cache))
    started = spark_session.session(
        spark.model_copy(update={"conf": conf}),
        app_name,
        work_dir=work_dir,
        jars=session_jars,
        object_store=object_store,
    )
    functions.register(started)
    return started
