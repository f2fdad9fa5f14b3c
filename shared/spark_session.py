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
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    in ``work_dir``, launched for this session's jars and driver settings
    (``DRIVER_LAUNCH_SETTINGS``) where an earlier session of the process
    launched it with others. Raises FailedPrecondition when this process
    already runs a session on another master or with other such settings."""
    from pyspark.sql import SparkSession

    global _launched
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
    jar_list = ",".join(str(jar) for jar in jars)
    if jar_list:
        builder = builder.config("spark.jars", jar_list)
    conf = {**(hadoop_options(object_store) if object_store else {}), **spark.conf}
    for key, value in conf.items():
        builder = builder.config(key, value)
    launch = _launch_settings(
        {"spark.driver.memory": spark.driver_memory, "spark.jars": jar_list, **conf}
    )
    launching = _driver_jvm_for(launch)
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
    if launching:
        _launched = (started.sparkContext._gateway, launch)
    started.sparkContext.setLogLevel("WARN")
    return started


#: What the driver's JVM takes only when it is launched (its class path, its
#: options, its heap): a session started later on the same JVM, in the same
#: process, runs without them.
DRIVER_LAUNCH_SETTINGS = (
    "spark.jars",
    "spark.driver.extraClassPath",
    "spark.driver.extraJavaOptions",
    "spark.driver.extraLibraryPath",
    "spark.driver.memory",
)
# The driver JVM this module launched last (its gateway) and its settings.
_launched: tuple[Any, dict[str, str]] | None = None


def _launch_settings(conf: dict[str, str]) -> dict[str, str]:
    return {key: conf[key] for key in DRIVER_LAUNCH_SETTINGS if conf.get(key)}


def _driver_jvm_for(launch: dict[str, str]) -> bool:
    """Whether the session about to start launches the driver's JVM.

    pyspark keeps its driver JVM for the life of the process, past the
    session that launched it, and starts the next session on it: that
    session's jars would be missing (``Can not load class``) and its driver
    options ignored. With no session running, a JVM this module launched with
    other settings is shut down here, and the next session launches its own;
    with one running on other settings, FailedPrecondition."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return True
    if _launched is None or _launched[0] is not gateway:
        return False  # not launched here: nothing known to differ
    was = _launched[1]
    differ = sorted(key for key in {*was, *launch} if was.get(key) != launch.get(key))
    if not differ:
        return False
    if SparkContext._active_spark_context is not None:
        raise FailedPrecondition(
            "this process already runs a Spark session whose driver was launched with "
            f"other {', '.join(differ)}: stop it first"
        )
    _shut_down_driver_jvm()
    return True


def stop_driver_jvm() -> None:
    """Stop this process's Spark session, if one runs, and the driver's JVM,
    if one was launched: pyspark keeps it until the process has exited, and
    what the JVM does as it exits (a flight recording written) comes then."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    if SparkContext._gateway is not None:
        _shut_down_driver_jvm()


def _shut_down_driver_jvm() -> None:
    from pyspark import SparkContext

    global _launched
    _launched = None
    gateway = SparkContext._gateway
    assert gateway is not None
    with SparkContext._lock:
        gateway.shutdown()
        process = getattr(gateway, "proc", None)
        if process is not None:
            # Spark's gateway server exits when its stdin closes.
            if process.stdin is not None:
                process.stdin.close()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        SparkContext._gateway = None
        SparkContext._jvm = None


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
