"""svc_monitor's Prometheus metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from shared.metrics import NAMESPACE


@dataclass(frozen=True)
class MonitorMetrics:
    windows: Counter
    judgements: Counter
    drift_events: Counter
    watched: Gauge
    dead_letters: Counter
    join_inputs: Counter
    settled: Counter
    pending: Gauge
    performance_events: Counter
    decisions: Counter
    started: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> MonitorMetrics:
        common: dict[str, Any] = {"namespace": NAMESPACE, "registry": registry}

        def counter(name: str, text: str, labels: tuple[str, ...]) -> Counter:
            return Counter(f"monitor_{name}", text, labels, **common)

        return cls(
            # Counted once its batch has been judged: a test that sees the
            # count knows the verdicts on those windows are in.
            windows=counter(
                "windows",
                "Feature windows read and judged: new, repeated (a window key seen "
                "before) or late (older than a full horizon)",
                ("outcome",),
            ),
            judgements=counter(
                "judgements",
                "Judgements of a watched version: steady, drift, or holding (drifted, "
                "and the horizon has not turned over since)",
                ("model", "verdict"),
            ),
            drift_events=counter("drift_events", "DriftDetected events published", ("model",)),
            watched=Gauge(
                "monitor_watched_models",
                "Models whose champion carries a training distribution",
                **common,
            ),
            dead_letters=counter("dead_letters", "Records dead-lettered", ("reason",)),
            join_inputs=counter(
                "join_inputs",
                "The joiner's inputs by kind (prediction, window, label) and what became "
                "of each: waiting, joined, expired, repeated, unusable (predictions); "
                "taken, late, repeated, open (truths)",
                ("kind", "outcome"),
            ),
            settled=counter(
                "predictions_settled",
                "Logged predictions settled on the joined topic: joined or expired",
                ("model", "outcome"),
            ),
            pending=Gauge(
                "monitor_predictions_pending",
                "Logged predictions waiting for their truth",
                **common,
            ),
            decisions=counter(
                "champion_decisions",
                "ChampionDecision events published, by kind",
                ("model", "kind"),
            ),
            performance_events=counter(
                "performance_events", "LivePerformance events published", ("model",)
            ),
            # Metrics answer from the process's first second, before the
            # replays: a probe of readiness reads this, not the port.
            started=Gauge(
                "monitor_started",
                "1 once the registry, the drift events and the windows' tail are "
                "replayed and the monitor follows its topics live, else 0",
                **common,
            ),
        )
