"""``python -m svc_transform``: the Spark Structured Streaming job, settings from the environment.

SIGTERM (or SIGINT) stops every query between micro-batches and exits 0; a
restart resumes from the checkpoints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.log import get_logger
from shared.metrics import serve_metrics
from shared.service_main import run, stop_on_signals

if TYPE_CHECKING:
    from svc_transform.settings import TransformSettings


def main() -> int:
    from svc_transform.settings import TransformSettings

    return run("svc_transform", TransformSettings, serve)


def serve(settings: TransformSettings) -> int:
    from svc_transform.app import TransformApp
    from svc_transform.metrics import TransformMetrics

    log = get_logger("svc_transform")
    app = TransformApp.prepare(settings)
    metrics = TransformMetrics.create()
    serve_metrics(settings.metrics_port, settings.common.metrics_host)
    stopping = stop_on_signals()
    running = app.start(metrics)
    try:
        while not stopping.is_set():
            if running.await_any(1):
                break  # a query ended on its own: its error is raised above
    finally:
        log.info("transform.stopping", signalled=stopping.is_set())
        app.stop()
    log.info("transform.stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
