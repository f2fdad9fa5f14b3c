"""A class-data-sharing archive of svc_transform's driver JVM: a restarted
job spends less of its start-up loading classes.

Most of a Spark driver's start is the JVM loading and verifying classes
from Spark's jars. A JVM (JDK 13+) can dump the classes a run loaded into an
archive when it exits (``-XX:ArchiveClassesAtExit``) and map that archive at
its next start (``-XX:SharedArchiveFile``). ``ensure`` builds one archive per
Spark, JDK, functions jar and class path (its jars' sizes and times too): a
child process starts svc_transform's session, runs its windows pipeline over
Spark's rate source for two micro-batches and exits, which writes the
archive. ``session_conf`` points the driver at it when it is there. The JVM
checks the archive against its own build and class path, and starts without
it (a warning in the log) where they differ.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shared.class_archive import archive_digest, jars_stamp, java_stamp
from shared.errors import ConfigError

#: The driver JVM's option Spark appends to its command line.
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: The most a build may take (a session, a few micro-batches, the dump).
BUILD_TIMEOUT_SECONDS = 300
#: The last micro-batch the warm-up runs (from 0) before it stops.
WARM_UP_BATCHES = 1
#: How Python starts a traceback on stderr.
TRACEBACK = "Traceback (most recent call last):"
#: Seconds between the warm-up's micro-batches.
WARM_UP_TRIGGER_SECONDS = 1


def java_executable() -> Path:
    """The java pyspark starts: ``$JAVA_HOME/bin/java``, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not Path(found).is_file():
        raise ConfigError("no java found (JAVA_HOME or PATH): Spark needs a JDK 17")
    return Path(found).resolve()


def archive_path(cache_dir: Path, functions_jar: Path) -> Path:
    """Where the archive for this Spark, this JDK, these functions and this
    class path lives: the JVM maps an archive only under the class path it
    was dumped with (pyspark's jars, which another checkout's environment
    holds elsewhere)."""
    from svc_transform.jars import SPARK_VERSION, driver_jar_path, pyspark_jars

    class_path = pyspark_jars().resolve()
    digest = archive_digest(
        [
            SPARK_VERSION,
            *java_stamp(java_executable()),
            functions_jar.name,
            # On the driver's class path at launch (svc_transform.spark).
            str(driver_jar_path(cache_dir)),
            str(class_path),
            jars_stamp(class_path),
        ]
    )
    return cache_dir / "spark-class-archive" / f"driver-{digest}.jsa"


def session_conf(conf: dict[str, str], cache_dir: Path, functions_jar: Path) -> dict[str, str]:
    """``conf`` with the driver mapping the archive, where one was built."""
    try:
        archive = archive_path(cache_dir, functions_jar)
    except ConfigError:
        return conf
    if not archive.is_file():
        return conf
    options = f"{conf.get(DRIVER_JAVA_OPTIONS, '')} -XX:SharedArchiveFile={archive}"
    return {**conf, DRIVER_JAVA_OPTIONS: options.strip()}


def ensure(cache_dir: Path, functions_jar: Path) -> Path:
    """The archive, built first when missing (in a child process, whose JVM
    writes it as it exits). Raises ConfigError when the build fails."""
    archive = archive_path(cache_dir, functions_jar)
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
        dumped = Path(tmp) / archive.name
        result = subprocess.run(
            [sys.executable, "-m", "svc_transform.class_archive", str(dumped), tmp],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_SECONDS,
            check=False,
        )
        if result.returncode != 0 or not dumped.is_file():
            raise ConfigError(
                f"could not build the driver's class archive: {build_failure(result.stderr)}"
            )
        # One archive per cache (each is about 160 MB): the last set-up's.
        # A job that finds none of its own starts without one.
        for old in archive.parent.glob("driver-*.jsa"):
            old.unlink()
        dumped.rename(archive)
    return archive


def build_failure(stderr: str) -> str:
    """Why a build failed: the child's Python error (its traceback's first
    unindented line; the JVM's logs and stack traces follow it on stderr as
    the JVM exits), else stderr's last lines."""
    lines = stderr.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK)]
    if starts:
        for line in lines[starts[-1] + 1 :]:
            if line and not line[0].isspace():
                return line
    return " | ".join(lines[-6:])


def warm_up(dump_to: Path, work_dir: Path) -> None:
    """Start svc_transform's session with the JVM set to dump its classes at
    exit, and run the windows pipeline for ``WARM_UP_BATCHES`` micro-batches."""
    from pyspark.sql import functions as F

    from shared.contracts.aistack.v1 import events_pb2
    from shared.settings import load_settings
    from svc_transform.job import open_window_specs
    from svc_transform.settings import TransformSettings
    from svc_transform.single_query import all_windows
    from svc_transform.spark import session
    from svc_transform.windows import aggregate, window_specs

    settings = load_settings(TransformSettings)
    # Local whatever the settings name: the driver's classes are what is
    # archived, and set-up must not depend on a cluster being up.
    spark_settings = settings.spark.model_copy(
        update={
            "master": "local[2]",
            "conf": {DRIVER_JAVA_OPTIONS: f"-XX:ArchiveClassesAtExit={dump_to}"},
        }
    )
    spark = session(
        spark_settings,
        "svc_transform-class-archive",
        cache_dir=settings.common.cache_dir,
        work_dir=work_dir,
        class_archive=False,
    )
    event = events_pb2.CleanEvent(event_id="warm-up", entity_id="sensor-1")
    event.event_time.FromSeconds(int(time.time()))
    event.sensor_reading.measurements.add(metric="temperature", value=20.0, unit="C")
    records = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", "100")
        .load()
        .select(
            F.lit(b"sensor-1").alias("key"),
            F.lit(event.SerializeToString()).alias("value"),
            F.lit(settings.source_topic).alias("topic"),
            (F.col("value") % 2).cast("int").alias("partition"),
            F.col("value").alias("offset"),
            F.col("timestamp"),
        )
    )
    # The shape the job runs (AISTACK_TRANSFORM_QUERIES): its classes are the ones to archive.
    specs, watermark = window_specs(settings), settings.watermark_seconds
    if settings.queries == "one":
        windows = all_windows(records, specs, open_window_specs(settings), watermark)
    else:
        windows = aggregate(records, specs, watermark)
    query = (
        windows.writeStream.outputMode("append")
        .format("noop")
        .option("checkpointLocation", str(work_dir / "checkpoint"))
        # A pause between micro-batches: with none, a trigger is active
        # almost always and the wait below for one to finish could miss it.
        .trigger(processingTime=f"{WARM_UP_TRIGGER_SECONDS} seconds")
        .start()
    )
    deadline = time.monotonic() + BUILD_TIMEOUT_SECONDS / 2
    while query.lastProgress is None or query.lastProgress["batchId"] < WARM_UP_BATCHES:
        if not query.isActive:
            raise ConfigError(f"the warm-up query stopped: {query.exception()}")
        if time.monotonic() > deadline:
            raise ConfigError(
                f"the warm-up query ran no micro-batch {WARM_UP_BATCHES} "
                f"within {BUILD_TIMEOUT_SECONDS / 2:.0f} s: {query.lastProgress}"
            )
        time.sleep(0.05)
    # Stop between micro-batches where one comes within a trigger: a stop
    # mid-batch still dumps the classes, with cancelled jobs in the log.
    between = time.monotonic() + WARM_UP_TRIGGER_SECONDS * 2
    while query.status["isTriggerActive"] and time.monotonic() < between:
        time.sleep(0.02)
    query.stop()
    spark.stop()
    # The JVM writes the archive as it exits, which it does when its stdin
    # (pyspark's gateway) closes: wait for that, not for this process's exit.
    gateway: Any = spark.sparkContext._gateway
    gateway.shutdown()
    gateway.proc.stdin.close()
    gateway.proc.wait(timeout=BUILD_TIMEOUT_SECONDS / 2)


def main(argv: list[str]) -> int:
    dump_to, work_dir = Path(argv[0]), Path(argv[1])
    warm_up(dump_to, work_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
