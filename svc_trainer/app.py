"""Wiring: one trainer replica built from its settings.

Start-up: the topics exist, the warm executor pool is ready to start
executors, then the worker joins the trainers' consumer group when it runs.
"""

from __future__ import annotations

from shared.bus.producer import BusProducer
from shared.bus.topics import ensure_topics
from svc_trainer.executors.pool import ExecutorPool, Limits
from svc_trainer.metrics import TrainerMetrics
from svc_trainer.settings import TrainerSettings
from svc_trainer.worker import SERVICE, Worker


def build_worker(settings: TrainerSettings) -> Worker:
    """Raises Unavailable (no broker); runner paths were checked when the
    settings loaded."""
    ensure_topics(settings.kafka, settings.topic_specs())
    executors = ExecutorPool(
        settings.runner_paths(),
        Limits(
            max_trials=settings.executor_max_trials,
            max_memory_bytes=settings.executor_max_memory_mb << 20,
        ),
        threads=settings.threads,
        cached_datasets=settings.cached_datasets,
        log_level=settings.common.log_level,
        log_format=settings.common.log_format,
        code_executors=settings.code_executors,
        spares=settings.spare_framework_names(),
        crash_dir=settings.work_dir() / "crashes",
    )
    producer = BusProducer(settings.kafka, source=SERVICE)
    return Worker(settings, producer, TrainerMetrics.create(), executors)
