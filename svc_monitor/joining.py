"""The joiner on the bus: logged predictions and their truths in, each
prediction settled once on the joined topic, each version's live error on
the performance topic, the champion rule's decisions on the decisions topic
(``svc_monitor.join``, ``svc_monitor.performance`` and
``svc_monitor.champion`` hold the rules).

Exactly once across restarts, the way svc_monitor keeps its drift events:
nothing is committed, and state is rebuilt from the topics at start.

1. the decisions topic, then the joined topic, are read to their ends:
   every prediction the joined topic holds is settled for good
   (``Joiner.remember``: by join id, and each truth stream's watermark at
   least the highest published), counted into the live errors once, and
   handed to the champion rule (``svc_monitor.deciding``), which publishes
   only the decisions the decisions topic lacks;
2. the predictions, then the labels, then the windows of the last
   ``join_lookback_seconds`` (by record time) are replayed, the watermarks
   held at the highest published (``Joiner.holding``), then released: what
   was not settled waits again, and is joined by the truths replayed after
   it or expires;
3. then all three are followed, in turn.

A settlement published before a kill is read back in step 1; one the kill
cut off is settled again, the same way under the same join id. A record
still in flight at the kill that lands after step 1 read the topic is a
repeat under the same join id, which consumers (and the next start) drop.
Every read is outside any consumer group: run one monitor.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from shared.bus.codec import MessageT
from shared.bus.consumer import BusTail, messages_to_end
from shared.bus.loop import Batch, ConsumeLoop, DeadLetters, Publisher
from shared.contracts.aistack.v1 import features_pb2, predictions_pb2
from shared.errors import NotFound, Unavailable
from shared.feature_store import FEATURE_LABEL, forecast_statistic, window_spans
from shared.log import get_logger
from shared.model_registry import Registry
from svc_monitor.deciding import Deciding
from svc_monitor.join import DEFAULT_STATISTIC, Forecast, Joiner, Resolve
from svc_monitor.metrics import MonitorMetrics
from svc_monitor.performance import Performance, Version
from svc_monitor.settings import MonitorSettings

log = get_logger("svc_monitor")

_SECOND_US = 1_000_000


def forecasts(models: Registry) -> Resolve:
    """What each version in ``models`` forecasts: the statistic its lineage
    names, of the window kind its feature label (or training distribution)
    names. A version not (yet) in the registry forecasts the default."""

    def resolve(name: str, version: str) -> Forecast:
        if not version:
            return Forecast()
        try:
            event = models.version(name, version)
        except NotFound:
            return Forecast()
        statistic = forecast_statistic(event.lineage.data.label) or DEFAULT_STATISTIC
        field = event.labels.get(FEATURE_LABEL, "")
        kind = field.rpartition("@")[2] if field else event.training_distribution.window
        spans = window_spans(kind)
        return Forecast(statistic, spans[1] * _SECOND_US if spans else None)

    return resolve


class JoinHandler:
    """Batches of predictions, windows or labels into the joiner; what it
    settles published, keyed by model name, under its join id; the live
    errors of the versions it changed, at most once per ``interval_us``."""

    def __init__(
        self,
        joiner: Joiner,
        performance: Performance,
        deciding: Deciding,
        publisher: Publisher,
        settings: MonitorSettings,
        metrics: MonitorMetrics,
        clock_us: Callable[[], int],
    ) -> None:
        self.joiner = joiner
        self.performance = performance
        self.deciding = deciding
        self._publisher = publisher
        self._joined_topic = settings.joined_topic
        self._performance_topic = settings.performance_topic
        self._interval_us = int(settings.performance_interval_seconds * _SECOND_US)
        self._metrics = metrics
        self._clock_us = clock_us
        self._changed: set[Version] = set()
        self._published_us: dict[Version, int] = {}

    def remember(self, joined: predictions_pb2.PredictionJoined) -> None:
        """One of the joiner's own earlier settlements, read back."""
        if self.joiner.remember(joined):
            self.performance.add(joined)
            self.deciding.add(joined)

    def predictions(self, batch: Batch[predictions_pb2.PredictionLogged]) -> None:
        self._settle(self.joiner.prediction(message) for message, _ in batch)

    def windows(self, batch: Batch[features_pb2.FeatureWindow]) -> None:
        self._settle(self.joiner.window(message, record.partition) for message, record in batch)

    def labels(self, batch: Batch[predictions_pb2.Label]) -> None:
        self._settle(self.joiner.label(message, record.partition) for message, record in batch)

    def release(self) -> None:
        """The replay is done: the watermarks move on (``Joiner.release``)."""
        self._settle([self.joiner.release()])

    def publish_due(self, *, force: bool = False) -> int:
        """Publish the live error of each changed version whose interval has
        passed (every one with ``force``); the caller flushes. Returns how many."""
        now = self._clock_us()
        due = [
            version
            for version in sorted(self._changed)
            if force
            or now - self._published_us.get(version, -self._interval_us) >= self._interval_us
        ]
        for version in due:
            event = self.performance.summary(version, now)
            self._publisher.publish(
                self._performance_topic,
                event,
                key=event.model_name,
                event_id=event.performance_id,
            )
            self._metrics.performance_events.labels(event.model_name).inc()
            self._changed.discard(version)
            self._published_us[version] = now
        return len(due)

    def _settle(self, settled: Iterable[Sequence[predictions_pb2.PredictionJoined]]) -> None:
        for events in settled:
            for joined in events:
                # The join id as the event id: a repeat is recognisable in the headers too.
                self._publisher.publish(
                    self._joined_topic, joined, key=joined.model_name, event_id=joined.join_id
                )
                self._changed.add(self.performance.add(joined))
                self.deciding.add(joined)
                outcome = predictions_pb2.JoinOutcome.Name(joined.outcome).removeprefix(
                    "JOIN_OUTCOME_"
                )
                self._metrics.settled.labels(joined.model_name, outcome.lower()).inc()
        self._metrics.pending.set(self.joiner.pending)
        self.publish_due()


class Joining:
    """Steps 1 to 3 of the module docstring, on one publisher."""

    def __init__(
        self,
        settings: MonitorSettings,
        publisher: Publisher,
        dead_letters: DeadLetters,
        models: Registry,
        metrics: MonitorMetrics,
        clock_us: Callable[[], int],
    ) -> None:
        self.settings = settings
        self._publisher = publisher
        self._dead_letters = dead_letters

        def observe(kind: str, outcome: str) -> None:
            metrics.join_inputs.labels(kind, outcome).inc()

        joiner = Joiner(
            int(settings.window_lateness_seconds * _SECOND_US),
            int(settings.label_lateness_seconds * _SECOND_US),
            forecasts(models),
            observe,
        )
        self.handler = JoinHandler(
            joiner,
            Performance(settings.performance_horizon),
            Deciding(settings, publisher, models, metrics),
            publisher,
            settings,
            metrics,
            clock_us,
        )
        self._loops: list[ConsumeLoop[Any]] = []
        self._closers: list[Callable[[], None]] = []

    def open(self, deadline: float) -> int:
        """Steps 1 and 2; returns how many settlements were read back. Raises
        Unavailable when the topics are not read by ``deadline`` (monotonic)."""
        s = self.settings
        self.handler.deciding.remember(max(deadline - time.monotonic(), 1.0))
        remembered = self._remember(max(deadline - time.monotonic(), 1.0))
        since_ms = time.time_ns() // 1_000_000 - int(s.join_lookback_seconds * 1000)
        h = self.handler
        h.joiner.holding = True
        # Predictions first: a truth replayed after them joins them, whatever
        # the watermark had let go before the restart.
        self._replay(
            s.predictions_topic, predictions_pb2.PredictionLogged, h.predictions, since_ms, deadline
        )
        self._replay(s.labels_topic, predictions_pb2.Label, h.labels, since_ms, deadline)
        self._replay(s.windows_topic, features_pb2.FeatureWindow, h.windows, since_ms, deadline)
        h.release()
        h.publish_due(force=True)
        self._publisher.flush()
        log.info(
            "joiner.started",
            remembered=remembered,
            pending=h.joiner.pending,
            since_ms=since_ms,
        )
        return remembered

    def step(self) -> None:
        """One poll of each topic, then the live errors now due."""
        for loop in self._loops:
            loop.step()
        if self.handler.publish_due():
            self._publisher.flush()

    def close(self) -> None:
        for closer in reversed(self._closers):
            closer()
        self._closers.clear()

    def _replay(
        self,
        topic: str,
        message_cls: type[MessageT],
        handle: Callable[[Batch[MessageT]], None],
        since_ms: int,
        deadline: float,
    ) -> None:
        """Read ``topic`` from ``since_ms`` to where it ends now; its loop
        then goes on following it in ``step``."""
        tail = self._tail(topic, message_cls, since_ms)
        loop = self._loop(tail, handle)
        while not tail.caught_up():
            if time.monotonic() > deadline:
                raise Unavailable(f"the topic {topic} was not read in time at start-up")
            loop.step()

    def _tail(self, topic: str, message_cls: type[MessageT], since_ms: int) -> BusTail[MessageT]:
        tail = BusTail(
            self.settings.kafka,
            topics=[topic],
            message_cls=message_cls,
            since_ms=since_ms,
            reader=f"svc_monitor.join.{topic}",
        )
        self._closers.append(tail.close)
        return tail

    def _loop(
        self, tail: BusTail[MessageT], handle: Callable[[Batch[MessageT]], None]
    ) -> ConsumeLoop[MessageT]:
        loop = ConsumeLoop(
            tail,
            handle,
            publisher=self._publisher,
            dead_letters=self._dead_letters,
            max_records=1000,
            poll_timeout=0.05,
        )
        self._loops.append(loop)
        return loop

    def _remember(self, timeout: float) -> int:
        settled = messages_to_end(
            self.settings.kafka,
            self.settings.joined_topic,
            predictions_pb2.PredictionJoined,
            timeout,
            reader="svc_monitor.joined",
        )
        for joined in settled:
            self.handler.remember(joined)
        return len(settled)
