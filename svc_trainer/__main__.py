"""``python -m svc_trainer``: one trainer replica, settings from the environment.

Consumes ``aistack.tuning.trials`` as a member of the trainers' consumer group
(run one replica per node or GPU host; each takes whole trials), reports on
``aistack.tuning.reports`` and publishes models on ``aistack.models.ready``.
SIGTERM hands the trial in flight back (its checkpoint stays) and exits 0.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

from shared.errors import AistackError, ConfigError
from shared.log import configure_logging
from shared.metrics import serve_metrics
from shared.settings import load_settings
from svc_trainer.settings import TrainerSettings


def main() -> int:
    try:
        settings = load_settings(TrainerSettings)
    except ConfigError as exc:
        print(f"svc_trainer: {exc}", file=sys.stderr)
        return 2
    configure_logging("svc_trainer", settings.common.log_level, settings.common.log_format)
    try:
        return serve(settings)
    except AistackError as exc:
        print(f"svc_trainer: {exc}", file=sys.stderr)
        return 1


def serve(settings: TrainerSettings) -> int:
    from shared.bus.producer import BusProducer
    from shared.bus.topics import ensure_topics
    from svc_trainer.executor import ExecutorPool, Limits
    from svc_trainer.metrics import TrainerMetrics
    from svc_trainer.worker import SERVICE, Worker

    ensure_topics(settings.kafka, settings.topic_specs())
    serve_metrics(settings.metrics_port)
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
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
    )
    worker = Worker(
        settings, BusProducer(settings.kafka, source=SERVICE), TrainerMetrics.create(), executors
    )
    worker.run(stopping)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
