"""``python -m svc_transform``: the Spark Structured Streaming job, settings from the environment.

SIGTERM (or SIGINT) stops every query between micro-batches and exits 0; a
restart resumes from the checkpoints.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from shared.errors import AistackError, ConfigError
from shared.log import configure_logging, get_logger
from shared.metrics import serve_metrics
from shared.settings import load_settings


def main() -> int:
    from svc_transform.settings import TransformSettings

    try:
        settings = load_settings(TransformSettings)
    except ConfigError as exc:
        print(f"svc_transform: {exc}", file=sys.stderr)
        return 2
    configure_logging("svc_transform", settings.common.log_level, settings.common.log_format)
    log = get_logger("svc_transform")

    from svc_transform.app import TransformApp
    from svc_transform.metrics import TransformMetrics

    try:
        app = TransformApp.prepare(settings)
    except AistackError as exc:
        print(f"svc_transform: {exc}", file=sys.stderr)
        return 1
    metrics = TransformMetrics.create()
    serve_metrics(settings.metrics_port, settings.common.metrics_host)
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    running = app.start(metrics)
    try:
        while not stopping:
            if running.await_any(1):
                break  # a query ended on its own: its error is raised above
    finally:
        log.info("transform.stopping", signal=stopping[0] if stopping else None)
        app.stop()
    log.info("transform.stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
