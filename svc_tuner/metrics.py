"""svc_tuner's Prometheus metrics."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from shared.metrics import NAMESPACE


@dataclass(frozen=True)
class TunerMetrics:
    reports: Counter
    drifts: Counter
    trials_requested: Counter
    controls: Counter
    dead_letters: Counter
    engine_seconds: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> TunerMetrics:
        def counter(name: str, help_text: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, help_text, labels, namespace=NAMESPACE, registry=registry)

        return cls(
            reports=counter("tuner_reports", "Trial reports read"),
            drifts=counter("tuner_drifts", "Drift events read"),
            trials_requested=counter(
                "tuner_trials_requested", "Trial requests published, first or again", ("attempt",)
            ),
            controls=counter("tuner_controls", "Control messages published", ("action",)),
            dead_letters=counter("tuner_dead_letters", "Reports dead-lettered", ("reason",)),
            # Per trial, this is the tuner's overhead: ask, publish, tell, storage.
            engine_seconds=counter(
                "tuner_engine_seconds", "Time the engine thread spent on studies"
            ),
        )
