"""Wiring: svc_monitor built from its settings.

Start-up, in order:

1. the topics exist;
2. the registry: ``aistack.models.ready`` replayed from its beginning
   (``shared.model_registry.Follower``);
3. the re-arm rule: every ``DriftDetected`` on the drift topic, so that a
   restart does not publish again for a version whose horizon has not
   turned over since its last event;
4. the horizons: the last ``rebuild_records`` records of each partition of
   the windows topic, read without a consumer group (nothing is committed:
   the horizon is rebuilt from the log's tail every start, so a restart does
   not wait for a full horizon), then judged once;
5. the joiner (``svc_monitor.joining``): its decisions and its own
   settlements read back (the champion rule on live traffic,
   ``svc_monitor.deciding``, runs over them again and publishes only what is
   missing), the predictions, labels and windows of its lookback replayed.

``run`` then follows the topics from one thread, in turn: new versions
into the registry and the watched versions, new windows into the horizons
and to the judge, then the joiner's predictions, labels and windows. The
joiner lives here, not in a service of its own, because it needs what the
monitor already has: the registry (which statistic and window kind a
version forecasts) and the windows. Every
read is outside any consumer group, so replicas would each publish: run one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import REGISTRY, CollectorRegistry

from shared import model_registry
from shared.bus.consumer import BusTail, messages_to_end
from shared.bus.loop import ConsumeLoop, DeadLetters, Publisher
from shared.bus.producer import BusProducer
from shared.bus.topics import ensure_topics
from shared.contracts.aistack.v1 import features_pb2, monitoring_pb2
from shared.errors import Unavailable
from shared.log import get_logger
from svc_monitor.handlers import ModelsHandler, WindowsHandler
from svc_monitor.horizon import Horizons
from svc_monitor.joining import Joining
from svc_monitor.metrics import MonitorMetrics
from svc_monitor.settings import MonitorSettings
from svc_monitor.watch import Judge, Registry

SERVICE = "svc_monitor"

log = get_logger(SERVICE)


def now_us() -> int:
    return time.time_ns() // 1000


class MonitorApp:
    """The registry, the horizons and the judge, fed from the bus."""

    def __init__(
        self,
        settings: MonitorSettings,
        producer: Publisher,
        metrics: MonitorMetrics,
        clock_us: Callable[[], int] = now_us,
    ) -> None:
        self.settings = settings
        self.producer = producer
        self.metrics = metrics
        self.models = model_registry.Registry()
        self.registry = Registry(self.models, settings.serving.policy)
        self.horizons = Horizons(settings.horizon_windows)
        self.judge = Judge(
            settings.thresholds(), settings.horizon_windows, settings.windows_topic, clock_us
        )
        self.dead_letters = DeadLetters(
            producer, topic=settings.dlq_topic, service=SERVICE, counter=metrics.dead_letters
        )
        self.models_handler = ModelsHandler(self.registry, metrics)
        self.windows_handler = WindowsHandler(
            self.horizons, self.registry, self.judge, producer, settings.drift_topic, metrics
        )
        self.joining = Joining(
            settings, producer, self.dead_letters, self.models, metrics, clock_us
        )
        self._follower: model_registry.Follower | None = None
        self._windows: BusTail[features_pb2.FeatureWindow] | None = None
        self._closers: list[Callable[[], None]] = []

    @classmethod
    def start(cls, settings: MonitorSettings, registry: CollectorRegistry = REGISTRY) -> MonitorApp:
        """Steps 1 to 4 above. Raises ConfigError (a bad Kafka setting),
        Unavailable (no broker, or a topic not read in time)."""
        ensure_topics(settings.kafka, settings.topic_specs())
        producer = BusProducer(settings.kafka, source=SERVICE)
        app = cls(settings, producer, MonitorMetrics.create(registry))
        app._closers.append(producer.close)
        try:
            app.open()
        except BaseException:
            app.close()
            raise
        return app

    def open(self) -> None:
        s = self.settings
        deadline = time.monotonic() + s.replay_timeout_seconds
        self._follower = model_registry.Follower.open(
            s.kafka,
            s.models_topic,
            reader=f"{SERVICE}.models",
            publisher=self.producer,
            dead_letters=self.dead_letters,
            registry=self.models,
            poll_timeout=0.1,
        )
        self._closers.append(self._follower.close)
        self.models_handler(self._follower.replay(max(deadline - time.monotonic(), 0.0)))
        remembered = self._remember(max(deadline - time.monotonic(), 1.0))
        self._windows = BusTail(
            s.kafka,
            topics=[s.windows_topic],
            message_cls=features_pb2.FeatureWindow,
            timeout=max(deadline - time.monotonic(), 1.0),
            last=s.rebuild_records,
            reader=f"{SERVICE}.windows",
        )
        self._closers.append(self._windows.close)
        if s.rebuild_records:
            windows = self._windows_loop(self._windows)
            self.windows_handler.judging = False
            while not self._windows.caught_up():
                _before(deadline, s.windows_topic)
                windows.step()
            self.windows_handler.judging = True
            self.windows_handler.judge_pending()
            self.producer.flush()
        self._closers.append(self.joining.close)
        self.joining.open(deadline)
        self.metrics.started.set(1)
        log.info(
            "monitor.started",
            watched=[(w.model_name, w.version, w.feature) for w in self.registry.watched()],
            features=len(self.horizons.features()),
            drift_events=remembered,
        )

    def run(self, stop: Callable[[], bool]) -> None:
        """Follow both topics until ``stop()`` is true (checked between polls).
        Raises Unavailable when the broker is gone for good."""
        if self._follower is None or self._windows is None:
            raise RuntimeError("MonitorApp.run before open")
        windows = self._windows_loop(self._windows)
        while not stop():
            self.models_handler(self._follower.step())
            windows.step()
            self.joining.step()

    def close(self) -> None:
        """Release the consumers, then deliver what is queued and close the producer."""
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception:
                log.exception("monitor.close_failed")
        self._closers.clear()
        log.info("monitor.stopped")

    def _remember(self, timeout: float) -> int:
        events = messages_to_end(
            self.settings.kafka,
            self.settings.drift_topic,
            monitoring_pb2.DriftDetected,
            timeout,
            reader=f"{SERVICE}.drift",
        )
        for event in events:
            self.judge.remember(event)
        return len(events)

    def _windows_loop(
        self, source: BusTail[features_pb2.FeatureWindow]
    ) -> ConsumeLoop[features_pb2.FeatureWindow]:
        return ConsumeLoop(
            source,
            self.windows_handler,
            publisher=self.producer,
            dead_letters=self.dead_letters,
            max_records=1000,
            poll_timeout=0.2,
        )


def _before(deadline: float, topic: str) -> None:
    if time.monotonic() > deadline:
        raise Unavailable(f"the topic {topic} was not read in time at start-up")
