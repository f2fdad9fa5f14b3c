"""``python -m svc_trainer``: one trainer replica, settings from the environment.

Consumes ``aistack.tuning.trials`` as a member of the trainers' consumer group
(run one replica per node or GPU host; each takes whole trials), reports on
``aistack.tuning.reports`` and publishes models on ``aistack.models.ready``.
SIGTERM hands the trial in flight back (its checkpoint stays) and exits 0.
"""

from __future__ import annotations

from shared.metrics import serve_metrics
from shared.service_main import run, stop_on_signals
from svc_trainer.settings import TrainerSettings


def main() -> int:
    return run("svc_trainer", TrainerSettings, serve)


def serve(settings: TrainerSettings) -> int:
    from svc_trainer.app import build_worker

    worker = build_worker(settings)
    serve_metrics(settings.metrics_port, settings.common.metrics_host)
    worker.run(stop_on_signals())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
