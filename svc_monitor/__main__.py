"""``python -m svc_monitor``: the drift monitor, settings from the environment.

Replays ``aistack.models.ready`` (which champion each model serves, and the
distribution it was trained on) and the drift topic (what was already
reported), refills the horizons from the tail of ``aistack.features.windows``,
then follows both topics and publishes ``DriftDetected`` on
``aistack.monitoring.drift``. Metrics on :9107. SIGTERM stops it between
polls and exits 0.
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
from svc_monitor.settings import MonitorSettings


def main() -> int:
    try:
        settings = load_settings(MonitorSettings)
    except ConfigError as exc:
        print(f"svc_monitor: {exc}", file=sys.stderr)
        return 2
    configure_logging("svc_monitor", settings.common.log_level, settings.common.log_format)
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    try:
        return serve(settings, stopping)
    except AistackError as exc:
        print(f"svc_monitor: {exc}", file=sys.stderr)
        return 1


def serve(settings: MonitorSettings, stopping: threading.Event) -> int:
    from svc_monitor.app import MonitorApp

    serve_metrics(settings.metrics_port, settings.common.metrics_host)
    app = MonitorApp.start(settings)
    try:
        app.run(stopping.is_set)
    finally:
        app.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
