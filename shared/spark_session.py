"""A SparkSession as every aistack Spark job starts one: the master and
sizing from ``SparkSettings``, the caller's jars, UTC session time.

svc_transform adds its Kafka connector and JVM functions, and Hadoop's S3A
connector where it reads and writes the object store (``object_store``:
``shared.object_store.hadoop_options``); svc_score needs no jars. The jars
are local files (``spark.jars``), so a job starts without network.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from shared.errors import FailedPrecondition
from shared.object_store import hadoop_options
from shared.settings import ObjectStoreSettings, SparkSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def session(
    spark: SparkSettings,
    app_name: str,
    *,
    work_dir: os.PathLike[str],
    jars: Sequence[Path] = (),
    object_store: ObjectStoreSettings | None = None,
) -> SparkSession:
    """Start (or join) the session: ``jars`` on its classpath, shuffle
    partitions sized to the cores, UTC session time, Python workers forked
    from ``shared.spark_daemon``; with ``object_store``,
    ``s3a://`` on that store and its committers (the S3A connector must be
    among ``jars``), under ``spark.conf``, which wins. The driver's JVM runs
    in ``work_dir``. Raises FailedPrecondition when this process already runs
    a session on another master."""
    from pyspark.sql import SparkSession

    if spark.is_local():
        export_local_spark_environment()
    executor_python = spark.conf.get(EXECUTOR_PYTHON_CONF)
    if executor_python:
        # spark-submit turns this setting into PYSPARK_PYTHON; a session built
        # here skips spark-submit, and pyspark reads only the variable.
        os.environ["PYSPARK_PYTHON"] = executor_python
    builder = (
        SparkSession.builder.master(spark.master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(spark.partitions()))
        .config("spark.driver.memory", spark.driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        # Python workers that keep the directories of the archives on their
        # path between tasks (shared.spark_daemon).
        .config(PYTHON_DAEMON_CONF, PYTHON_DAEMON_MODULE)
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in jars))
    conf = {**(hadoop_options(object_store) if object_store else {}), **spark.conf}
    for key, value in conf.items():
        builder = builder.config(key, value)
    # py4j logs every connection at INFO, down to interpreter exit.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # Spark 4.0.0 writes artifacts/ into its working directory (SPARK-52396,
    # fixed in later releases): start the JVM in ours, not the caller's.
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(work_dir):
        started = builder.getOrCreate()
    running = started.sparkContext.master
    if running != spark.master:
        # getOrCreate hands back a running session as it is: its master and
        # sizing cannot change, and a job would run where it was not sent.
        raise FailedPrecondition(
            f"AISTACK_SPARK_MASTER is {spark.master}, but this process already runs "
            f"a Spark session on {running}"
        )
    started.sparkContext.setLogLevel("WARN")
    return started


#: The Spark setting naming the Python the executors run.
EXECUTOR_PYTHON_CONF = "spark.pyspark.python"
#: The Spark setting naming the module the executors' Python daemon runs,
#: and aistack's (``shared.spark_daemon``).
PYTHON_DAEMON_CONF = "spark.python.daemon.module"
PYTHON_DAEMON_MODULE = "shared.spark_daemon"

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

    The one place aistack writes the environment (with ``session``'s
    ``spark.pyspark.python``), and only for Spark: pyspark
    reads ``PYSPARK_PYTHON`` from ``os.environ`` itself, and starts the driver's
    JVM (which reads ``SPARK_LOCAL_IP``) with a copy of ``os.environ``; neither
    takes them from the session's conf. No aistack code reads them.
    """
    for name, value in LOCAL_SPARK_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
