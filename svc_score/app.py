"""Wiring of ``aistack score``: the model registry (``shared.model_registry``)
for the version, a Spark session, the job."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from shared import model_registry, spark_session
from shared.bus.topics import PREDICTIONS_BATCH, TOPICS_BY_NAME, ensure_topics
from svc_score import job
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
    output: Path,
    columns: tuple[str, ...] = (),
    where: str = "",
    publish: bool = False,
    row_sources: bool = False,
    spark: SparkSession | None = None,
) -> job.Scored:
    """Score ``input_path`` with ``model`` (``NAME`` or ``NAME@VERSION``) into
    ``output`` (only the rows matching ``where``, when given; each row with
    its ``sources`` when ``row_sources``), and with ``publish`` to
    ``settings.predictions_topic`` (made if missing). Starts a
    Spark session from ``settings.spark`` unless one is given. Raises
    AistackError subclasses, each one line (see ``job.score``)."""
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
    session = spark or spark_session.session(
        settings.spark, "aistack-score", work_dir=settings.work_dir()
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
        )
    finally:
        if (session.sparkContext.master or "").startswith("local"):
            # The local workers keep their models in memory; their copies can go.
            shutil.rmtree(cache / job.EXECUTORS, ignore_errors=True)
        if own:
            session.stop()
