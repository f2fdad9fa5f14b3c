"""``python -m svc_tuner``: the tuner service, settings from the environment.

Serves ``aistack.v1.TunerService`` (default :50051), publishes trial requests
and control messages, and consumes trial reports. Its state is Optuna's
journal in Redis, so a restarted tuner continues every open study. SIGTERM
stops it between steps and exits 0.
"""

from __future__ import annotations

import asyncio
import signal

from shared.metrics import serve_metrics
from shared.service_main import run
from svc_tuner.settings import TunerSettings


def main() -> int:
    return run("svc_tuner", TunerSettings, lambda settings: asyncio.run(serve(settings)))


async def serve(settings: TunerSettings) -> int:
    from svc_tuner.app import TunerApp

    serve_metrics(settings.metrics_port, settings.common.metrics_host)
    app = await TunerApp.start(settings)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await app.run(stopping)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
