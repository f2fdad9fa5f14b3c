"""svc_trainer's Prometheus metrics."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from shared.metrics import NAMESPACE


@dataclass(frozen=True)
class TrainerMetrics:
    # outcome: completed, pruned, failed, handed_back
    trials: Counter
    epochs: Counter
    samples_per_second: Gauge
    busy: Gauge
    trial_seconds: Histogram
    models_published: Counter
    dead_letters: Counter
    executor_deaths: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> TrainerMetrics:
        return cls(
            trials=Counter(
                "trainer_trials",
                "Trials ended, by outcome",
                ("outcome", "framework"),
                namespace=NAMESPACE,
                registry=registry,
            ),
            epochs=Counter(
                "trainer_epochs", "Epochs trained", namespace=NAMESPACE, registry=registry
            ),
            samples_per_second=Gauge(
                "trainer_samples_per_second",
                "Training throughput of the last epoch",
                namespace=NAMESPACE,
                registry=registry,
            ),
            busy=Gauge(
                "trainer_busy", "1 while a trial trains", namespace=NAMESPACE, registry=registry
            ),
            trial_seconds=Histogram(
                "trainer_trial_seconds",
                "Wall time of a trial, start to final report",
                buckets=(5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, float("inf")),
                namespace=NAMESPACE,
                registry=registry,
            ),
            models_published=Counter(
                "trainer_models_published",
                "Model-ready events published",
                namespace=NAMESPACE,
                registry=registry,
            ),
            dead_letters=Counter(
                "trainer_dead_letters",
                "Trial requests dead-lettered",
                ("reason",),
                namespace=NAMESPACE,
                registry=registry,
            ),
            executor_deaths=Counter(
                "trainer_executor_deaths",
                "Executors that died while training a trial (crash, out of memory)",
                namespace=NAMESPACE,
                registry=registry,
            ),
        )
