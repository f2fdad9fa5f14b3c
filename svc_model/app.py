"""Wiring: svc_model built from its settings.

Start-up: the topics exist, the registry is replayed and what the policy
keeps is loaded, then the gRPC server listens — a client that can connect
finds the repository rebuilt (ServerReady is true from the first call).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry

from shared.bus.producer import BusProducer
from shared.bus.topics import ensure_topics
from shared.log import get_logger
from shared.redis_client import make_async_redis
from shared.rpc.server import RunningServer, start_server
from svc_model.features import OnlineFeatures
from svc_model.inference import InferenceCore
from svc_model.loading import Loader
from svc_model.metrics import ModelMetrics
from svc_model.registry import SERVICE, RegistryFollower
from svc_model.servicer import SERVICE_NAME, register
from svc_model.settings import ModelSettings

log = get_logger(SERVICE)


@dataclass
class ModelServer:
    settings: ModelSettings
    core: InferenceCore
    follower: RegistryFollower
    server: RunningServer
    features: OnlineFeatures
    producer: BusProducer
    pools: tuple[ThreadPoolExecutor, ...]

    @property
    def port(self) -> int:
        return self.server.port

    @classmethod
    async def start(
        cls, settings: ModelSettings, registry: CollectorRegistry = REGISTRY
    ) -> ModelServer:
        """Raises ConfigError (a bad address, TLS files), Unavailable (no broker)."""
        ensure_topics(settings.kafka, settings.topic_specs())
        metrics = ModelMetrics.create(registry)
        loading_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="model-load")
        features = OnlineFeatures(make_async_redis(settings.redis), settings.online_key_prefix)
        core = InferenceCore(settings, Loader(settings, metrics), loading_pool, metrics, features)
        producer = BusProducer(settings.kafka, source=SERVICE)
        follower = RegistryFollower(settings, core, producer, metrics.dead_letters)
        await follower.start()
        server = await start_server(settings.server_options(), register(core), [SERVICE_NAME])
        log.info("model_server.started", port=server.port, models=core.repository.names())
        return cls(
            settings=settings,
            core=core,
            follower=follower,
            server=server,
            features=features,
            producer=producer,
            pools=(loading_pool,),
        )

    async def stop(self, grace: float = 5.0) -> None:
        """Stop taking calls, let those in flight finish, then release everything."""
        await self.server.stop(grace)
        await self.follower.stop()
        await self.features.close()
        self.producer.close()
        for pool in self.pools:
            pool.shutdown(wait=False, cancel_futures=True)
        log.info("model_server.stopped")
