"""``python -m svc_monitor`` on the real broker: stationary windows give no
DriftDetected, shifted ones exactly one with the right fields; a restart
rebuilds the horizon from the topic's tail and does not report it again;
SIGTERM stops it with 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.bus.consumer import read_to_end
from shared.bus.producer import BusProducer
from shared.bus.topics import ensure_topics
from shared.contracts.aistack.v1 import features_pb2, monitoring_pb2
from shared.ports import free_port
from svc_monitor.settings import MonitorSettings
from tests.infra import Infra, metric_value, wait_until
from tests.unit.test_monitor_watch import (
    FEATURE,
    MINUTE_US,
    MODEL,
    T0_US,
    distribution,
    model_ready,
    windows,
)

pytestmark = pytest.mark.integration

HORIZON = 60
STARTED = '"event": "monitor.started"'


class MonitorProcess:
    """The service as a process, with its own metrics port and log file."""

    def __init__(self, infra: Infra, settings: MonitorSettings, log_path: Path) -> None:
        self.metrics_port = free_port()
        self.log_path = log_path
        env = {
            **os.environ,
            "AISTACK_KAFKA_BOOTSTRAP": infra.kafka.bootstrap,
            "AISTACK_LOG_FORMAT": "json",
            "AISTACK_MONITOR_MODELS_TOPIC": settings.models_topic,
            "AISTACK_MONITOR_WINDOWS_TOPIC": settings.windows_topic,
            "AISTACK_MONITOR_DRIFT_TOPIC": settings.drift_topic,
            "AISTACK_MONITOR_DLQ_TOPIC": settings.dlq_topic,
            "AISTACK_MONITOR_PREDICTIONS_TOPIC": settings.predictions_topic,
            "AISTACK_MONITOR_LABELS_TOPIC": settings.labels_topic,
            "AISTACK_MONITOR_JOINED_TOPIC": settings.joined_topic,
            "AISTACK_MONITOR_PERFORMANCE_TOPIC": settings.performance_topic,
            "AISTACK_MONITOR_DECISIONS_TOPIC": settings.decisions_topic,
            "AISTACK_MONITOR_CHAMPION_MIN_PAIRS": str(settings.champion_min_pairs),
            "AISTACK_MONITOR_CHAMPION_ALPHA": str(settings.champion_alpha),
            "AISTACK_MONITOR_DEGRADED_MARGIN": str(settings.degraded_margin),
            "AISTACK_MONITOR_WINDOW_LATENESS_SECONDS": str(settings.window_lateness_seconds),
            "AISTACK_MONITOR_PERFORMANCE_INTERVAL_SECONDS": str(
                settings.performance_interval_seconds
            ),
            "AISTACK_MONITOR_HORIZON_WINDOWS": str(HORIZON),
            "AISTACK_MONITOR_METRICS_PORT": str(self.metrics_port),
        }
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "svc_monitor"], env=env, stdout=self._log, stderr=self._log
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_started(self) -> None:
        wait_until(
            lambda: STARTED in self.log_text() or self.process.poll() is not None,
            60,
            "the monitor did not start",
        )
        assert self.process.poll() is None, self.log_text()[-3000:]

    def metric(self, name: str, labels: str = "") -> float:
        return metric_value(self.metrics_port, f"aistack_monitor_{name}", labels)

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, nothing flushed that was not."""
        self.process.kill()
        self.process.wait(timeout=10)

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self._log.close()


def monitor_settings(infra: Infra, unique: str, **overrides: Any) -> MonitorSettings:
    """svc_monitor's settings on this test's own topics, which exist."""
    settings = MonitorSettings(
        kafka=infra.kafka,
        models_topic=f"models-{unique}",
        windows_topic=f"windows-{unique}",
        drift_topic=f"drift-{unique}",
        dlq_topic=f"dlq-{unique}",
        predictions_topic=f"predictions-{unique}",
        labels_topic=f"labels-{unique}",
        joined_topic=f"joined-{unique}",
        performance_topic=f"performance-{unique}",
        decisions_topic=f"decisions-{unique}",
        **overrides,
    )
    ensure_topics(settings.kafka, settings.topic_specs())
    return settings


@pytest.fixture
def settings(infra: Infra, unique: str) -> MonitorSettings:
    return monitor_settings(infra, unique, horizon_windows=HORIZON)


@pytest.fixture
def launch() -> Iterator[list[MonitorProcess]]:
    started: list[MonitorProcess] = []
    yield started
    for process in started:
        process.close()


def drift_events(settings: MonitorSettings) -> list[monitoring_pb2.DriftDetected]:
    records = read_to_end(settings.kafka, settings.drift_topic, monitoring_pb2.DriftDetected, 30)
    return [record.decode() for record in records]


def test_shifted_windows_drift_once_and_stationary_ones_never(
    infra: Infra, settings: MonitorSettings, launch: list[MonitorProcess], tmp_path: Path
) -> None:
    serving = model_ready(1, 0.5, distribution())
    with BusProducer(infra.kafka, source="tests") as producer:
        producer.publish(settings.models_topic, serving, key=f"{MODEL}/1")
        producer.flush()
    monitor = MonitorProcess(infra, settings, tmp_path / "monitor-1.log")
    launch.append(monitor)
    monitor.wait_started()
    assert monitor.metric("started") == 1
    assert monitor.metric("watched_models") == 1

    def publish(batch: list[features_pb2.FeatureWindow]) -> None:
        with BusProducer(infra.kafka, source="tests") as producer:
            for window in batch:
                producer.publish(settings.windows_topic, window, key=window.entity_id)
            producer.flush()

    publish(windows(0, HORIZON))
    # Counted once judged: after this, every verdict on them is in.
    wait_until(
        lambda: monitor.metric("windows_total", '{outcome="new"}') == HORIZON,
        30,
        "the stationary windows were not read",
    )
    assert monitor.metric("judgements_total", f'{{model="{MODEL}",verdict="steady"}}') >= 1
    assert monitor.metric("judgements_total", f'{{model="{MODEL}",verdict="drift"}}') == 0
    assert drift_events(settings) == []

    publish(windows(HORIZON, HORIZON, shift=6.0))
    wait_until(
        lambda: monitor.metric("windows_total", '{outcome="new"}') == 2 * HORIZON,
        30,
        "the shifted windows were not read",
    )
    # Judged; the loop delivers what a batch published before it reads on.
    wait_until(lambda: drift_events(settings) != [], 30, "no DriftDetected")
    [event] = drift_events(settings)
    assert (event.model_name, event.model_version, event.feature) == (MODEL, "1", FEATURE)
    assert event.study_id == "study-1" and event.serving == serving
    assert {s.statistic for s in event.scores if s.drifted} == {"mean"}
    assert event.thresholds.horizon_windows == HORIZON and event.thresholds.min_windows == 20
    assert {r.topic for r in event.windows} == {settings.windows_topic}
    assert sum(r.count for r in event.windows) == HORIZON
    # The horizon when it drifted ends in the shifted windows.
    last = event.last_window_start.ToMicroseconds()
    assert T0_US + HORIZON * MINUTE_US <= last <= T0_US + (2 * HORIZON - 1) * MINUTE_US
    # Sixty distinct minutes span at least 59 of them; more when the
    # partitions were read unevenly (a sensor's shifted windows in before
    # another's), the horizon being the latest sixty by start, not a run.
    first = event.first_window_start.ToMicroseconds()
    assert T0_US <= first <= last - (HORIZON - 1) * MINUTE_US
    assert monitor.metric("drift_events_total", f'{{model="{MODEL}"}}') == 1
    assert monitor.terminate() == 0
    assert '"event": "monitor.stopped"' in monitor.log_text()

    # A restart refills the horizon from the tail and holds what it reported.
    again = MonitorProcess(infra, settings, tmp_path / "monitor-2.log")
    launch.append(again)
    again.wait_started()
    read = sum(
        again.metric("windows_total", f'{{outcome="{outcome}"}}')
        for outcome in ("new", "late", "repeated")
    )
    assert read == 2 * HORIZON
    assert again.metric("judgements_total", f'{{model="{MODEL}",verdict="holding"}}') == 1
    assert [e.drift_id for e in drift_events(settings)] == [event.drift_id]
    assert again.terminate() == 0
