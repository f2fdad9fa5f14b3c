"""svc_ingest's Prometheus metrics: every raw record is counted by its outcome."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from shared.metrics import NAMESPACE


@dataclass(frozen=True)
class IngestMetrics:
    records_in: Counter
    outcomes: Counter
    dead_letters: Counter
    consumer_lag: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> IngestMetrics:
        return cls(
            records_in=Counter(
                "ingest_records_in",
                "Raw records read",
                namespace=NAMESPACE,
                registry=registry,
            ),
            outcomes=Counter(
                "ingest_records",
                "Raw records by outcome: clean, dead_letter or duplicate",
                ["outcome"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            dead_letters=Counter(
                "ingest_dead_letters",
                "Dead letters by reason",
                ["reason"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            consumer_lag=Gauge(
                "ingest_consumer_lag",
                "Records of the raw topic not yet processed, per partition",
                ["partition"],
                namespace=NAMESPACE,
                registry=registry,
            ),
        )
