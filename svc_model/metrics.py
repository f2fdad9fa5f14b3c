"""svc_model's Prometheus metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from shared.metrics import NAMESPACE

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
MODEL_CODE = ("model", "code")
_DELAY_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


@dataclass(frozen=True)
class ModelMetrics:
    requests: Counter
    latency: Histogram
    batch_rows: Histogram
    queue_delay: Histogram
    in_flight: Gauge
    loaded_versions: Gauge
    serving_version: Gauge
    loads: Counter
    load_failures: Counter
    dead_letters: Counter
    predictions_logged: Counter
    prediction_log_dropped: Counter
    shadow_runs: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> ModelMetrics:
        common: dict[str, Any] = {"namespace": NAMESPACE, "registry": registry}

        def counter(name: str, text: str, labels: tuple[str, ...]) -> Counter:
            return Counter(f"model_{name}", text, labels, **common)

        def gauge(name: str, text: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"model_{name}", text, labels, **common)

        def histogram(name: str, text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"model_{name}", text, ("model",), buckets=buckets, **common)

        return cls(
            requests=counter("requests", "ModelInfer calls by model and status code", MODEL_CODE),
            latency=histogram(
                "request_seconds",
                "ModelInfer latency in the server, admission to response",
                _LATENCY_BUCKETS,
            ),
            batch_rows=histogram(
                "batch_size",
                "Rows per model execution (merged requests count once per execution)",
                _BATCH_BUCKETS,
            ),
            queue_delay=histogram(
                "queue_delay_seconds", "Time a request waited in its model's queue", _DELAY_BUCKETS
            ),
            in_flight=gauge("requests_in_flight", "ModelInfer calls admitted and not answered yet"),
            loaded_versions=gauge("loaded_versions", "Versions loaded per model", ("model",)),
            serving_version=gauge(
                "serving_version", "The version a request without a version gets", ("model",)
            ),
            loads=counter("loads", "Versions loaded", ("model",)),
            load_failures=counter(
                "load_failures",
                "Model-ready events refused (bad checksum, unloadable, ...)",
                ("model", "reason"),
            ),
            dead_letters=counter(
                "dead_letters", "Records of the models topic dead-lettered", ("reason",)
            ),
            predictions_logged=counter(
                "predictions_logged",
                "Prediction-log records handed to the producer (later delivery failures "
                "also count as dropped)",
                (),
            ),
            prediction_log_dropped=counter(
                "prediction_log_dropped",
                "Prediction-log records dropped, by reason (queue_full, delivery_failed, ...)",
                ("reason",),
            ),
            shadow_runs=counter(
                "shadow_runs",
                "Challengers run in the champion's shadow, by model and outcome (ok, "
                "failed, skipped: too many in flight)",
                ("model", "outcome"),
            ),
        )
