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
    from svc_trainer.app import build_worker

    worker = build_worker(settings)
    serve_metrics(settings.metrics_port, settings.common.metrics_host)
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker.run(stopping)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
