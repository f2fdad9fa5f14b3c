"""svc_model's settings: ``AISTACK_MODEL_*`` and the shared ones."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.bus.topics import EVENTS_DLQ, MODELS_READY, PREDICTIONS, TOPICS_BY_NAME, TopicSpec
from shared.feature_store import ONLINE_KEY_PREFIX
from shared.rpc.settings import GrpcServerSettings
from shared.settings import ServingSettings


class ModelSettings(GrpcServerSettings):
    model_config = SettingsConfigDict(env_prefix="AISTACK_MODEL_", frozen=True, extra="ignore")

    # Triton's gRPC port, so that clients need no configuration.
    grpc_address: str = "0.0.0.0:8001"
    # Inference calls in flight beyond this are refused with RESOURCE_EXHAUSTED
    # rather than queued without bound.
    max_concurrent_requests: int = Field(default=256, ge=1, le=100_000)
    models_topic: str = MODELS_READY
    dlq_topic: str = EVENTS_DLQ
    # Which version serves (AISTACK_MODEL_POLICY): shared with every reader
    # of the registry, so that what is watched and scored is what serves.
    serving: ServingSettings = Field(default_factory=ServingSettings)
    # Versions kept loaded per model besides the champion (newest first).
    keep_versions: int = Field(default=2, ge=1, le=100)
    # Dynamic batching (Triton's semantics): requests queued while the model is
    # busy, or within the delay, run as one batch of at most max_batch_size rows.
    batching: bool = True
    max_batch_size: int = Field(default=64, ge=1, le=1 << 16)
    max_queue_delay_us: int = Field(default=0, ge=0, le=10_000_000)
    # Concurrent executions of one model version (Triton's instance count).
    instances: int = Field(default=1, ge=1, le=64)
    # Threads each framework uses inside one execution (0: the framework's
    # default, one per core). One by default: a server's parallelism is its
    # requests' (instances, batching), and an execution's team of threads
    # spins on the cores the event loop and the clients need.
    intra_op_threads: int = Field(default=1, ge=0, le=1024)
    # A single-threaded version whose one-row call took at most this long at
    # load runs requests on the event loop, as KServe runs a synchronous
    # predict (no thread hand-over): unbatched on one instance, every request;
    # batched, a request alone in the server (svc_model.inference). 0: never.
    inline_max_ms: float = Field(default=1.0, ge=0.0, le=1000.0)
    # A torch.export program with a batch dimension runs as TorchScript traced
    # from it where that computes the same (shared.model_loading.traced_program).
    trace_exported: bool = True
    # svc_transform's online store: one hash per entity under this prefix.
    online_key_prefix: str = ONLINE_KEY_PREFIX
    # Where artifacts on remote stores (s3://…) are copied before loading.
    artifact_cache_dir: Path | None = None
    # How long start-up waits to replay the models topic before giving up.
    replay_timeout_seconds: float = Field(default=120.0, gt=0, le=3600)
    metrics_port: int = Field(default=9106, ge=0, le=65535)
    # The prediction log: the share of requests logged, by entity and with
    # tensors (0 turns that kind off; both 0, the log is off).
    prediction_log_topic: str = PREDICTIONS
    prediction_log_entity_fraction: float = Field(default=1.0, ge=0.0, le=1.0)
    prediction_log_tensor_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    # Records waiting to be sent beyond which new ones are dropped (counted),
    # so that a broker away costs bounded memory and never a request.
    prediction_log_queue: int = Field(default=100_000, ge=1, le=10_000_000)
    # Challengers (AISTACK_MODEL_CHALLENGERS) run on this share of the
    # requests the champion serves, off the request path; their predictions
    # and the champion's of the same requests go to the prediction log (so
    # only while it is on). 0: no shadows.
    shadow_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    # Shadow runs in flight beyond which a new one is skipped (and counted):
    # a slow challenger costs bounded memory and never a caller's request.
    shadow_max_in_flight: int = Field(default=64, ge=1, le=100_000)

    def cache_dir(self) -> Path:
        return self.artifact_cache_dir or self.common.state_dir / "model-cache"

    def prediction_log_on(self) -> bool:
        return self.prediction_log_entity_fraction > 0 or self.prediction_log_tensor_fraction > 0

    def topic_specs(self) -> list[TopicSpec]:
        specs = [
            TOPICS_BY_NAME[MODELS_READY].named(self.models_topic),
            TOPICS_BY_NAME[EVENTS_DLQ].named(self.dlq_topic),
        ]
        if self.prediction_log_on():
            specs.append(TOPICS_BY_NAME[PREDICTIONS].named(self.prediction_log_topic))
        return specs
