"""svc_transform's SparkSession: the shared session with its own jars (the
Kafka connector, protobuf-java, its JVM functions) and functions registered."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from shared import spark_session
from shared.settings import SparkSettings
from svc_transform import jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def session(
    spark: SparkSettings,
    app_name: str,
    *,
    cache_dir: os.PathLike[str],
    work_dir: os.PathLike[str],
) -> SparkSession:
    """Start (or join) the session with the connector and our functions from
    the local cache (no network at start-up)."""
    from svc_transform import functions

    # Fair scheduling: the open-window query's small jobs take turns with the
    # closed-window query's (svc_transform.job.start_open_windows).
    spark = spark.model_copy(update={"conf": {"spark.scheduler.mode": "FAIR", **spark.conf}})
    started = spark_session.session(
        spark, app_name, work_dir=work_dir, jars=jars.session_jars(Path(cache_dir))
    )
    functions.register(started)
    return started
