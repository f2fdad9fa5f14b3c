"""``python -m svc_tuner``: the tuner service, settings from the environment.

Serves ``aistack.v1.TunerService`` (default :50051), publishes trial requests
and control messages, and consumes trial reports. Its state is Optuna's
journal in Redis, so a restarted tuner continues every open study. SIGTERM
stops it between steps and exits 0.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from shared.errors import AistackError, ConfigError
from shared.log import configure_logging, get_logger
from shared.metrics import serve_metrics
from shared.settings import load_settings
from svc_tuner.settings import TunerSettings


def main() -> int:
    try:
        settings = load_settings(TunerSettings)
    except ConfigError as exc:
        print(f"svc_tuner: {exc}", file=sys.stderr)
        return 2
    configure_logging("svc_tuner", settings.common.log_level, settings.common.log_format)
    try:
        return asyncio.run(serve(settings))
    except AistackError as exc:
        print(f"svc_tuner: {exc}", file=sys.stderr)
        return 1


async def serve(settings: TunerSettings) -> int:
    from shared.bus.producer import BusProducer
    from shared.bus.topics import ensure_topics
    from shared.rpc.server import start_server
    from svc_tuner.api import SERVICE_NAME, register
    from svc_tuner.engine import Engine, redis_storage
    from svc_tuner.metrics import TunerMetrics
    from svc_tuner.service import SERVICE, Tuner

    log = get_logger(SERVICE)
    ensure_topics(settings.kafka, settings.topic_specs())
    engine = Engine(redis_storage(settings.redis, settings.storage_prefix))
    metrics = TunerMetrics.create()
    serve_metrics(settings.metrics_port)
    tuner = Tuner(settings, engine, BusProducer(settings.kafka, source=SERVICE), metrics)
    server = await start_server(settings.server_options(), register(tuner), [SERVICE_NAME])
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    log.info("tuner.started", port=server.port, storage=settings.storage_prefix)
    try:
        await tuner.run(stopping)
    finally:
        await server.stop(grace=5)
    log.info("tuner.stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
