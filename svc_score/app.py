"""Wiring of ``aistack score``: the model registry (``shared.model_registry``)
for the version, a Spark session (reaching the object store where the input
or the output is on it), the job."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from shared import hadoop_s3a, model_registry, spark_session
from shared.bus.topics import PREDICTIONS_BATCH, TOPICS_BY_NAME, ensure_topics
from shared.settings import ObjectStoreSettings, SparkSettings
from svc_score import job
from svc_score.output import is_remote
from svc_score.plan import choose, parse_model
from svc_score.publish import Publication
from svc_score.settings import ScoreSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run(
    settings: ScoreSettings,
    model: str,
    *,
    input_path: str,
    output: Path | str,
    columns: tuple[str, ...] = (),
    where: str = "",
    publish: bool = False,
    row_sources: bool = False,
    spark: SparkSession | None = None,
) -> job.Scored:
    """Score ``input_path`` with ``model`` (``NAME`` or ``NAME@VERSION``) into
    ``output`` (only the rows matching ``where``, when given; each row with
    its ``sources`` when ``row_sources``), and with ``publish`` to
    ``settings.predictions_topic`` (made if missing). Either may be a URL on
    ``settings.object_store`` (``s3://``, ``s3a://``). Starts a Spark session
    from ``settings.spark`` unless one is given: where the input or the
    output is a URL, with Hadoop's S3A connector on that store (its jars
    from the cache, fetched first when missing); a job on local paths needs
    neither the jars nor Maven. Raises AistackError subclasses, each one line
    (see ``job.score``)."""
    name, version = parse_model(model)
    registry = model_registry.read(
        settings.kafka, settings.models_topic, settings.replay_timeout_seconds
    )
    event = choose(registry, name, version, settings.serving.policy)
    publish_to = None
    if publish:
        topic = settings.predictions_topic
        ensure_topics(settings.kafka, [TOPICS_BY_NAME[PREDICTIONS_BATCH].named(topic)])
        publish_to = Publication(settings.kafka, topic)
    own = spark is None
    on_the_store = is_remote(input_path) or is_remote(output)
    session = spark or start_session(
        settings.spark,
        work_dir=settings.work_dir(),
        cache_dir=settings.common.cache_dir,
        object_store=settings.object_store if on_the_store else None,
        # A --where condition is Spark SQL: Spark reads and filters the rows;
        # --publish reads the output back through Spark.
        rows_through_jvm=bool(where) or publish,
    )
    cache = settings.cache_dir()
    try:
        return job.score(
            session,
            event,
            input_path=input_path,
            output=output,
            cache_dir=cache,
            columns=columns,
            where=where,
            publish_to=publish_to,
            row_sources=row_sources,
            object_store=settings.object_store,
        )
    finally:
        if (session.sparkContext.master or "").startswith("local"):
            # The local workers keep their models in memory; their copies can go.
            shutil.rmtree(cache / job.EXECUTORS, ignore_errors=True)
        if own:
            session.stop()


#: The JVM option that keeps HotSpot's JIT at its first tier (C1).
C1_ONLY = "-XX:TieredStopAtLevel=1"
_DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def start_session(
    spark: SparkSettings,
    *,
    work_dir: Path,
    cache_dir: Path,
    object_store: ObjectStoreSettings | None,
    rows_through_jvm: bool,
) -> SparkSession:
    """The session of one scoring job (``driver_settings``): with
    ``object_store``, Hadoop's S3A connector on it (its jars from
    ``cache_dir``, fetched first when missing)."""
    return spark_session.session(
        driver_settings(spark, rows_through_jvm=rows_through_jvm),
        "aistack-score",
        work_dir=work_dir,
        jars=hadoop_s3a.ensure_jars(cache_dir) if object_store is not None else (),
        object_store=object_store,
    )


def driver_settings(spark: SparkSettings, *, rows_through_jvm: bool) -> SparkSettings:
    """``spark`` for a scoring job's session. Unless rows pass through the
    driver's own JVM (a local master with ``rows_through_jvm``: a ``--where``
    read, a ``--publish``), the driver's JIT stops at C1 (``C1_ONLY``):
    without a row to run, the JVM only plans and schedules, its C2
    compiler threads took 0.2-0.4 s of CPU a job on the cores the Python
    tasks score on, and the session starts sooner (4.5-5.9 s against
    5.4-7.1 s here). Where rows do pass, C2's code reads them faster (a
    ``--where`` job over a million rows, 3.5 s against 5.0 s with C1 alone).
    ``spark.driver.extraJavaOptions`` in ``spark.conf`` wins."""
    if rows_through_jvm and spark.is_local():
        return spark
    return spark.model_copy(update={"conf": {_DRIVER_JAVA_OPTIONS: C1_ONLY, **spark.conf}})
