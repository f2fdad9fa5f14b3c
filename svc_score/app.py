"""Wiring of ``aistack score``: the model registry (``shared.model_registry``)
for the version, a Spark session (reaching the object store where the input
or the output is on it), the job."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from shared import hadoop_s3a, model_registry, spark_session
from shared.bus.topics import PREDICTIONS_BATCH, TOPICS_BY_NAME, ensure_topics
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
    session = spark or _session(settings, is_remote(input_path) or is_remote(output))
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


def _session(settings: ScoreSettings, on_the_store: bool) -> SparkSession:
    """A session from ``settings.spark``; ``on_the_store``: with S3A on
    ``settings.object_store``."""
    return spark_session.session(
        settings.spark,
        "aistack-score",
        work_dir=settings.work_dir(),
        jars=hadoop_s3a.ensure_jars(settings.common.cache_dir) if on_the_store else (),
        object_store=settings.object_store if on_the_store else None,
    )
