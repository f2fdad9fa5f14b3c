"""``python -m svc_monitor``: the drift monitor, settings from the environment.

Replays ``aistack.models.ready`` (which champion each model serves, and the
distribution it was trained on) and the drift topic (what was already
reported), refills the horizons from the tail of ``aistack.features.windows``,
then follows both topics and publishes ``DriftDetected`` on
``aistack.monitoring.drift``. Metrics on :9107. SIGTERM stops it between
polls and exits 0.
"""

from __future__ import annotations

import threading

from shared.metrics import serve_metrics
from shared.service_main import run, stop_on_signals
from svc_monitor.settings import MonitorSettings


def main() -> int:
    return run("svc_monitor", MonitorSettings, lambda settings: serve(settings, stop_on_signals()))


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
