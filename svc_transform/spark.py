"""A SparkSession for svc_transform: the master, jars and sizing from settings."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from svc_transform import jars
from svc_transform.settings import SparkSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def session(
    spark: SparkSettings,
    app_name: str,
    *,
    cache_dir: os.PathLike[str],
    work_dir: os.PathLike[str],
) -> SparkSession:
    """Start (or join) the session: the Kafka connector and our functions from
    the local cache (no network at start-up), shuffle partitions sized to the
    cores, UTC session time. The driver's JVM runs in ``work_dir``."""
    from pyspark.sql import SparkSession

    from svc_transform import functions

    if spark.is_local():
        export_local_spark_environment()
    session_jars = jars.session_jars(Path(cache_dir))
    builder = (
        SparkSession.builder.master(spark.master)
        .appName(app_name)
        .config("spark.jars", ",".join(str(jar) for jar in session_jars))
        .config("spark.sql.shuffle.partitions", str(spark.partitions()))
        .config("spark.driver.memory", spark.driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in spark.conf.items():
        builder = builder.config(key, value)
    # py4j logs every connection at INFO, down to interpreter exit.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # Spark 4.0.0 writes artifacts/ into its working directory (SPARK-52396,
    # fixed in later releases): start the JVM in ours, not the caller's.
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(work_dir):
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    functions.register(session)
    return session


#: What a local master's processes need from this process's environment.
LOCAL_SPARK_ENVIRONMENT = {
    # Without it Spark resolves the host name, which fails or picks a public
    # interface on many laptops and CI machines.
    "SPARK_LOCAL_IP": "127.0.0.1",
    # Python workers from this interpreter (its venv), not the first python3
    # on PATH; on a cluster the executors' own Python is set there.
    "PYSPARK_PYTHON": sys.executable,
}


def export_local_spark_environment() -> None:
    """Put ``LOCAL_SPARK_ENVIRONMENT`` into this process's environment where
    the user has not set those variables.

    The one place aistack writes the environment, and only for Spark: pyspark
    reads ``PYSPARK_PYTHON`` from ``os.environ`` itself, and starts the driver's
    JVM (which reads ``SPARK_LOCAL_IP``) with a copy of ``os.environ``; neither
    takes them from the session's conf. No aistack code reads them.
    """
    for name, value in LOCAL_SPARK_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
