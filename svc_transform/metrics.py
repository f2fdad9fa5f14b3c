"""svc_transform's Prometheus metrics, fed from each query's progress reports."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from shared.metrics import NAMESPACE


@dataclass(frozen=True)
class TransformMetrics:
    rows_in: Counter
    late_rows_dropped: Counter
    windows_out: Counter
    batch_seconds: Gauge
    busy_seconds: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> TransformMetrics:
        return cls(
            rows_in=Counter(
                "transform_rows_in",
                "Records read from the clean topic, per query",
                ["query"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            late_rows_dropped=Counter(
                "transform_late_rows_dropped",
                "Observations older than the watermark (their pane closed), dropped",
                ["query"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            windows_out=Counter(
                "transform_windows_out",
                "Closed windows written to the sinks, per query",
                ["query"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            batch_seconds=Gauge(
                "transform_batch_seconds",
                "Duration of the last micro-batch, per query",
                ["query"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            # rows_in / busy_seconds is the rate a query can process at,
            # whatever its trigger interval leaves idle.
            busy_seconds=Counter(
                "transform_busy_seconds",
                "Time spent in micro-batches, per query",
                ["query"],
                namespace=NAMESPACE,
                registry=registry,
            ),
        )
