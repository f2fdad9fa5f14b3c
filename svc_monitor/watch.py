"""Which served versions the monitor watches, and its verdicts on them.

- ``Registry``: per model name, the version the model server serves under
  the serving policy (``AISTACK_MODEL_POLICY``: the champion by
  ``shared.objective``'s rule, or the newest), as the model registry
  (``shared.model_registry``, kept by its follower from
  ``aistack.models.ready``) says. A serving version that carries a training
  distribution is watched on its feature.
- ``Judge``: after a batch of windows, each watched champion whose feature
  got new windows, with at least ``min_windows`` in the horizon, is judged:
  every statistic of its reference against the horizon
  (``svc_monitor.drift.assess``). Any statistic drifted: one
  ``DriftDetected``. No storm: after an event for a version, that version is
  judged again only once the horizon has turned over completely (its oldest
  window starts after the event's last); the rule reads only the events, so
  events replayed from the drift topic restore it after a restart. A new
  champion version is judged afresh: its reference is new.

Pure: no bus; the caller publishes what ``judge`` returns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from shared import model_registry
from shared.contracts.aistack.v1 import common_pb2, models_pb2, monitoring_pb2
from shared.feature_store import merge_sources
from shared.log import get_logger
from shared.settings import ServingPolicy
from svc_monitor.drift import Reference, Score, Thresholds, assess
from svc_monitor.horizon import Horizon, Horizons

log = get_logger("svc_monitor")


@dataclass(frozen=True)
class Watched:
    """A champion version and the reference of each statistic of its feature."""

    serving: models_pb2.ModelReady
    feature: str
    references: dict[str, Reference]

    @property
    def model_name(self) -> str:
        return self.serving.model_name

    @property
    def version(self) -> str:
        return self.serving.version


def watched(event: models_pb2.ModelReady) -> Watched | None:
    """What ``event`` is watched on; None without a training distribution,
    or with none of its references readable (logged)."""
    if not event.HasField("training_distribution"):
        return None
    distribution = event.training_distribution
    references = {}
    for summary in distribution.statistics:
        try:
            references[summary.statistic] = Reference.of_summary(summary)
        except ValueError as exc:
            log.warning(
                "reference.unreadable",
                model=event.model_name,
                version=event.version,
                statistic=summary.statistic,
                error=str(exc),
            )
    if not distribution.feature or not references:
        return None
    return Watched(event, distribution.feature, references)


class Registry:
    """The serving versions with a distribution, watched. The versions are
    those of ``models`` (the registry its follower keeps; the models handler
    says which model changed)."""

    def __init__(self, models: model_registry.Registry, policy: ServingPolicy = "champion") -> None:
        self._models = models
        self._policy = policy
        self._watched: dict[str, Watched] = {}

    def update(self, name: str) -> bool:
        """Look again at the model ``name`` after its versions changed;
        whether its watched version changed."""
        best = self._models.serving(name, self._policy)
        now = watched(best) if best is not None else None
        before = self._watched.get(name)
        if now is None:
            self._watched.pop(name, None)
        else:
            self._watched[name] = now
        changed = (before is None) != (now is None) or (
            before is not None and now is not None and before.serving != now.serving
        )
        if changed:
            log.info(
                "model.watched" if now is not None else "model.unwatched",
                model=name,
                version=now.version if now is not None else "",
                feature=now.feature if now is not None else "",
            )
        return changed

    def watched(self) -> list[Watched]:
        """The watched champions, by model name."""
        return [self._watched[name] for name in sorted(self._watched)]


class Verdict(Enum):
    """A judgement's outcome."""

    STEADY = "steady"
    DRIFT = "drift"
    # Drifted before, and the horizon has not turned over since.
    HOLDING = "holding"


@dataclass(frozen=True)
class Judgement:
    model_name: str
    version: str
    verdict: Verdict
    event: monitoring_pb2.DriftDetected | None = None


class Judge:
    """Verdicts on the watched champions; remembers the last event of each
    version (the re-arm rule)."""

    def __init__(
        self,
        thresholds: Thresholds,
        horizon_windows: int,
        windows_topic: str,
        clock_us: Callable[[], int],
    ) -> None:
        self._thresholds = thresholds
        self._horizon_windows = horizon_windows
        self._windows_topic = windows_topic
        self._clock_us = clock_us
        # (model, version) -> the last event's last window start.
        self._last_event: dict[tuple[str, str], int] = {}

    def remember(self, event: monitoring_pb2.DriftDetected) -> None:
        """An event published before (replayed from the drift topic)."""
        key = (event.model_name, event.model_version)
        last = event.last_window_start.ToMicroseconds()
        self._last_event[key] = max(last, self._last_event.get(key, last))

    def judge(
        self, watching: Iterable[Watched], horizons: Horizons, changed: set[str]
    ) -> list[Judgement]:
        """A judgement of each watched version whose feature is in
        ``changed`` and whose horizon holds ``min_windows``."""
        judgements = []
        for watch in watching:
            horizon = horizons.get(watch.feature)
            if watch.feature not in changed or horizon is None:
                continue
            if len(horizon) < self._thresholds.min_windows:
                continue
            judgements.append(self._judge(watch, horizon))
        return judgements

    def _judge(self, watch: Watched, horizon: Horizon) -> Judgement:
        key = (watch.model_name, watch.version)
        last = self._last_event.get(key)
        if last is not None and horizon.first_start_us <= last:
            return Judgement(watch.model_name, watch.version, Verdict.HOLDING)
        values = horizon.values(list(watch.references))
        scores = assess(watch.references, values, self._thresholds)
        if not any(s.drifted for s in scores.values()):
            return Judgement(watch.model_name, watch.version, Verdict.STEADY)
        event = self._event(watch, horizon, scores)
        self._last_event[key] = horizon.last_start_us
        return Judgement(watch.model_name, watch.version, Verdict.DRIFT, event)

    def _event(
        self, watch: Watched, horizon: Horizon, scores: dict[str, Score]
    ) -> monitoring_pb2.DriftDetected:
        thresholds = self._thresholds
        ranges = [
            common_pb2.OffsetRange(**span)
            for span in merge_sources(
                {
                    "topic": self._windows_topic,
                    "partition": e.position.partition,
                    "min_offset": e.position.offset,
                    "max_offset": e.position.offset,
                    "count": 1,
                }
                for e in horizon
            )
        ]
        event = monitoring_pb2.DriftDetected(
            drift_id=drift_id(watch.model_name, watch.version, watch.feature, ranges),
            model_name=watch.model_name,
            model_version=watch.version,
            feature=watch.feature,
            study_id=watch.serving.lineage.study_id,
            scores=[
                monitoring_pb2.StatisticDrift(
                    statistic=name,
                    psi=s.psi,
                    ks=s.ks,
                    ks_critical=s.ks_critical,
                    windows=s.windows,
                    drifted=s.drifted,
                )
                for name, s in sorted(scores.items())
            ],
            thresholds=monitoring_pb2.DriftThresholds(
                psi=thresholds.psi,
                ks=thresholds.ks,
                alpha=thresholds.alpha,
                min_windows=thresholds.min_windows,
                horizon_windows=self._horizon_windows,
            ),
            windows=ranges,
            serving=watch.serving,
        )
        event.first_window_start.FromMicroseconds(horizon.first_start_us)
        event.last_window_start.FromMicroseconds(horizon.last_start_us)
        event.detected_time.FromMicroseconds(self._clock_us())
        return event


def drift_id(
    model_name: str, version: str, feature: str, ranges: Iterable[common_pb2.OffsetRange]
) -> str:
    """Deterministic: the model, version, feature and the last window position
    judged in each partition of the windows topic."""
    last = ",".join(f"{r.topic}:{r.partition}:{r.max_offset}" for r in ranges)
    text = "\n".join((model_name, version, feature, last))
    return hashlib.sha256(text.encode()).hexdigest()[:32]
