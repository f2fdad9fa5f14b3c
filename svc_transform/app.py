"""Wiring: svc_transform built from its settings.

Start-up: the topics exist and the Spark session is up (``prepare``), then
the streaming queries start (``start``); ``stop`` ends the queries between
micro-batches, then the session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared import object_store
from shared.bus.topics import (
    EVENTS_CLEAN,
    EVENTS_DLQ,
    FEATURES_WINDOWS,
    TOPICS_BY_NAME,
    ensure_topics,
)
from svc_transform import job
from svc_transform.metrics import TransformMetrics
from svc_transform.settings import TransformSettings
from svc_transform.spark import session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class TransformApp:
    settings: TransformSettings
    spark: SparkSession
    running: job.Job | None = field(default=None)

    @classmethod
    def prepare(cls, settings: TransformSettings) -> TransformApp:
        """Raises Unavailable (no broker)."""
        ensure_topics(
            settings.kafka,
            [
                TOPICS_BY_NAME[EVENTS_CLEAN].named(settings.source_topic),
                TOPICS_BY_NAME[FEATURES_WINDOWS].named(settings.features_topic),
                TOPICS_BY_NAME[EVENTS_DLQ].named(settings.dlq_topic),
            ],
        )
        # The cloud committers only where a path is on the store: local disk
        # keeps Spark's default commit protocol, whose dynamic partition
        # overwrite replaces a replayed batch's partition.
        on_the_store = any(
            object_store.is_object_url(path)
            for path in (settings.checkpoint_path(), settings.offline_path())
        )
        spark = session(
            settings.spark,
            "svc_transform",
            cache_dir=settings.common.cache_dir,
            work_dir=settings.common.state_dir / "spark",
            object_store=settings.object_store if on_the_store else None,
        )
        return cls(settings=settings, spark=spark)

    def start(self, metrics: TransformMetrics) -> job.Job:
        self.running = job.start(self.spark, self.settings, metrics)
        return self.running

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()
        self.spark.stop()
