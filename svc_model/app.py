"""Wiring: svc_model built from its settings.

Start-up: the topics exist, the registry is replayed and what the policy
keeps is loaded, then the gRPC server listens — a client that can connect
finds the repository rebuilt (ServerReady is true from the first call).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry

from shared.bus.producer import BusProducer
from shared.bus.topics import ensure_topics
from shared.log import get_logger
from shared.redis_client import make_async_redis
from shared.rpc.server import RunningServer, start_server
from shared.settings import KafkaSettings
from svc_model.features import OnlineFeatures
from svc_model.inference import InferenceCore
from svc_model.loading import Loader
from svc_model.metrics import ModelMetrics
from svc_model.prediction_log import PredictionLog, Sampler
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
    prediction_log: PredictionLog | None = None

    @property
    def port(self) -> int:
        return self.server.port

    @classmethod
    async def start(
        cls,
        settings: ModelSettings,
        registry: CollectorRegistry = REGISTRY,
        *,
        prediction_log_kafka: KafkaSettings | None = None,
    ) -> ModelServer:
        """``prediction_log_kafka``: the prediction log's broker when it is not
        ``settings.kafka`` (tests point it at one that is not there).

        Raises ConfigError (a bad address, TLS files), Unavailable (no broker)."""
        ensure_topics(settings.kafka, settings.topic_specs())
        metrics = ModelMetrics.create(registry)
        loading_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="model-load")
        features = OnlineFeatures(make_async_redis(settings.redis), settings.online_key_prefix)
        prediction_log = _prediction_log(settings, metrics, prediction_log_kafka)
        core = InferenceCore(
            settings, Loader(settings, metrics), loading_pool, metrics, features, prediction_log
        )
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
            prediction_log=prediction_log,
        )

    async def stop(self, grace: float = 5.0) -> None:
        """Stop taking calls, let those in flight finish, then release everything."""
        await self.server.stop(grace)
        await self.follower.stop()
        await self.features.close()
        if self.prediction_log is not None:
            # Bounded by the grace: a broker away must not hold the shutdown.
            self.prediction_log.close(timeout=grace)
        self.producer.close()
        for pool in self.pools:
            pool.shutdown(wait=False, cancel_futures=True)
        log.info("model_server.stopped")


def _prediction_log(
    settings: ModelSettings, metrics: ModelMetrics, kafka: KafkaSettings | None
) -> PredictionLog | None:
    if not settings.prediction_log_on():
        return None
    prediction_log = PredictionLog.to_kafka(
        kafka or settings.kafka,
        settings.prediction_log_topic,
        Sampler(settings.prediction_log_entity_fraction, settings.prediction_log_tensor_fraction),
        capacity=settings.prediction_log_queue,
        logged=metrics.predictions_logged,
        dropped=metrics.prediction_log_dropped,
    )
    prediction_log.start(asyncio.get_running_loop())
    return prediction_log
