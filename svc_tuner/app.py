"""Wiring: svc_tuner built from its settings.

Start-up: the topics exist, the engine opens its journal in Redis, then the
gRPC server listens; ``run`` consumes reports and ticks until told to stop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry

from shared.bus.producer import BusProducer
from shared.bus.topics import ensure_topics
from shared.log import get_logger
from shared.rpc.server import RunningServer, start_server
from svc_tuner.api import SERVICE_NAME, register
from svc_tuner.engine import Engine
from svc_tuner.metrics import TunerMetrics
from svc_tuner.service import SERVICE, Tuner
from svc_tuner.settings import TunerSettings
from svc_tuner.storage import redis_storage

log = get_logger(SERVICE)


@dataclass
class TunerApp:
    settings: TunerSettings
    tuner: Tuner
    server: RunningServer

    @property
    def port(self) -> int:
        return self.server.port

    @classmethod
    async def start(
        cls, settings: TunerSettings, registry: CollectorRegistry = REGISTRY
    ) -> TunerApp:
        """Raises ConfigError (a bad address, TLS files), Unavailable (no broker)."""
        ensure_topics(settings.kafka, settings.topic_specs())
        engine = Engine(
            redis_storage(settings.redis, settings.storage_prefix), policy=settings.serving.policy
        )
        producer = BusProducer(settings.kafka, source=SERVICE)
        tuner = Tuner(settings, engine, producer, TunerMetrics.create(registry))
        server = await start_server(settings.server_options(), register(tuner), [SERVICE_NAME])
        log.info("tuner.started", port=server.port, storage=settings.storage_prefix)
        return cls(settings=settings, tuner=tuner, server=server)

    async def run(self, stopping: asyncio.Event) -> None:
        """Serve until ``stopping`` is set (or the report consumer fails, which
        raises Unavailable); then stop taking calls."""
        try:
            await self.tuner.run(stopping)
        finally:
            await self.server.stop(grace=5)
        log.info("tuner.stopped")
