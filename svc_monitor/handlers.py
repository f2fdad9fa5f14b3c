"""svc_monitor's handlers: the model registry's updates (read by
``shared.model_registry.Follower``) into the watched versions, and, run by
``shared.bus.loop.ConsumeLoop``, feature windows into the horizons and then
the judge; what it finds is published on the drift topic, keyed by model
name.

Thin: the registry, the horizons and the judge are ``svc_monitor.watch`` and
``svc_monitor.horizon``. The loop flushes after each batch, so an event is
delivered before the next batch is read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from shared.bus.loop import Batch, Publisher
from shared.contracts.aistack.v1 import features_pb2
from shared.log import get_logger
from shared.model_registry import Update
from svc_monitor.horizon import Horizons, Outcome, Position
from svc_monitor.metrics import MonitorMetrics
from svc_monitor.watch import Judge, Registry

log = get_logger("svc_monitor")


class ModelsHandler:
    def __init__(self, registry: Registry, metrics: MonitorMetrics) -> None:
        self._registry = registry
        self._metrics = metrics

    def __call__(self, updates: Sequence[Update]) -> None:
        """After the follower read ``updates``: each model they changed is
        looked at again. An event the registry skipped (no model, a bad
        version: the model server dead-letters it) changes nothing."""
        if not updates:
            return
        changed = set()
        for event, _, skipped in updates:
            if skipped:
                log.warning(
                    "model.skipped", model=event.model_name, version=event.version, reason=skipped
                )
            else:
                changed.add(event.model_name)
        for name in sorted(changed):
            self._registry.update(name)
        self._metrics.watched.set(len(self._registry.watched()))


class WindowsHandler:
    """Windows into the horizons; the features that got new ones are judged
    after each batch, or, while ``judging`` is off (the horizons are being
    rebuilt), kept until ``judge_pending``."""

    def __init__(
        self,
        horizons: Horizons,
        registry: Registry,
        judge: Judge,
        publisher: Publisher,
        drift_topic: str,
        metrics: MonitorMetrics,
    ) -> None:
        self._horizons = horizons
        self._registry = registry
        self._judge = judge
        self._publisher = publisher
        self._drift_topic = drift_topic
        self._metrics = metrics
        self._pending: set[str] = set()
        self.judging = True

    def __call__(self, batch: Batch[features_pb2.FeatureWindow]) -> None:
        outcomes: Counter[Outcome] = Counter()
        for window, record in batch:
            added = self._horizons.add(window, Position(record.partition, record.offset))
            new = {feature for feature, outcome in added.items() if outcome is Outcome.NEW}
            self._pending |= new
            outcomes[_overall(added.values())] += 1
        if self.judging:
            self.judge_pending()
        for outcome, count in outcomes.items():
            self._metrics.windows.labels(outcome.value).inc(count)

    def judge_pending(self) -> None:
        """Judge the watched versions of every feature with new windows since
        the last judgement, and publish what drifted (the caller flushes)."""
        changed, self._pending = self._pending, set()
        for judgement in self._judge.judge(self._registry.watched(), self._horizons, changed):
            self._metrics.judgements.labels(judgement.model_name, judgement.verdict.value).inc()
            event = judgement.event
            if event is None:
                continue
            # The drift id as the event id: a repeat after a restart is
            # recognisable in the headers as well.
            self._publisher.publish(
                self._drift_topic, event, key=event.model_name, event_id=event.drift_id
            )
            self._metrics.drift_events.labels(event.model_name).inc()
            log.warning(
                "drift.detected",
                model=event.model_name,
                version=event.model_version,
                feature=event.feature,
                drift_id=event.drift_id,
                drifted=[s.statistic for s in event.scores if s.drifted],
                windows=sum(r.count for r in event.windows),
            )


def _overall(outcomes: Iterable[Outcome]) -> Outcome:
    """A window is new if any of its features' horizons took it, repeated if
    every one had it already, else late."""
    seen = set(outcomes)
    if Outcome.NEW in seen:
        return Outcome.NEW
    if seen == {Outcome.REPEATED}:
        return Outcome.REPEATED
    return Outcome.LATE
