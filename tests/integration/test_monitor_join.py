"""``python -m svc_monitor``'s joiner on the real broker: logged forecasts
joined with the windows they predict (a champion's and its shadow's of one
request alike, a late window within the lateness, one beyond it dropped and
its forecast expired), digits predictions (ten class probabilities) joined
with the labels users publish, the monitor killed mid-stream and restarted:
each prediction settled once, as a joiner that ran through settles it, and
each version's live error from exactly those settlements."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.message import Message

from shared.bus.consumer import read_to_end
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import features_pb2, monitoring_pb2, predictions_pb2
from shared.contracts.aistack.v1.predictions_pb2 import (
    JOIN_OUTCOME_EXPIRED,
    JOIN_OUTCOME_JOINED,
    PREDICTION_ROLE_SHADOW,
)
from svc_monitor.settings import MonitorSettings
from tests.infra import Infra, wait_until
from tests.integration import test_monitor
from tests.integration.test_monitor import MonitorProcess, monitor_settings
from tests.unit.test_monitor_join import (
    DIGITS,
    FORECASTER,
    LATENESS_US,
    SECOND_US,
    digits_prediction,
    feed,
    forecast,
    joiner,
    label,
    truth_window,
)
from tests.unit.test_monitor_watch import model_ready

pytestmark = pytest.mark.integration

Item = predictions_pb2.PredictionLogged | features_pb2.FeatureWindow | predictions_pb2.Label


# Monitors a test started, closed after it: test_monitor's fixture.
launch = test_monitor.launch


@pytest.fixture
def settings(infra: Infra, unique: str) -> MonitorSettings:
    return monitor_settings(
        infra,
        unique,
        window_lateness_seconds=LATENESS_US / SECOND_US,
        performance_interval_seconds=0.0,
    )


def window(entity: int, minute: int) -> features_pb2.FeatureWindow:
    return truth_window(minute, 20.0 + minute / 10, entity=f"sensor-{entity}")


def prediction(entity: int, minute: int) -> predictions_pb2.PredictionLogged:
    return forecast(f"sensor-{entity}-{minute}", minute, 20.0 + entity, entity=f"sensor-{entity}")


def before_the_kill() -> list[Item]:
    shadow = forecast("sensor-0-0", 0, 20.5, entity="sensor-0", version="2")
    shadow.role = PREDICTION_ROLE_SHADOW
    digits = [digits_prediction(f"image-{i}", guess) for i, guess in enumerate((3, 7, 5, 0))]
    return [
        *(prediction(e, m) for m in range(4) for e in range(3)),
        shadow,
        # Sensor 0's minute 2 stays out: it comes late, after the kill.
        *(window(e, m) for m in range(1, 4) for e in range(3) if (e, m) != (0, 2)),
        *digits,
        label("image-0", 3, 1),
        label("image-1", 1, 2),
    ]


def while_it_is_down() -> list[Item]:
    return [
        *(window(e, 4) for e in range(3)),  # the watermark: minute 5 - 2 = 3
        window(0, 2),  # ends at minute 3: late, within the lateness
        prediction(1, 5),  # its truth, minute 6, never comes
        # The watermark, the least of the partitions': minute 10 - 2 = 8, so
        # the forecast expires (the unit tests drop a window too late).
        *(window(e, 9) for e in range(3)),
        label("image-2", 5, 3),
        label("image-3", 9, 4),
    ]


def publish(infra: Infra, settings: MonitorSettings, items: Iterable[Item]) -> None:
    topics: dict[type[Message], str] = {
        predictions_pb2.PredictionLogged: settings.predictions_topic,
        features_pb2.FeatureWindow: settings.windows_topic,
        predictions_pb2.Label: settings.labels_topic,
    }
    with BusProducer(infra.kafka, source="tests") as producer:
        for item in items:
            key = getattr(item, "entity_id", "") or item.request_id  # type: ignore[union-attr]
            producer.publish(topics[type(item)], item, key=key or None)
        producer.flush()


def joined(settings: MonitorSettings) -> list[predictions_pb2.PredictionJoined]:
    records = read_to_end(
        settings.kafka, settings.joined_topic, predictions_pb2.PredictionJoined, 30
    )
    return [r.decode() for r in records]


def performance(settings: MonitorSettings) -> list[monitoring_pb2.LivePerformance]:
    records = read_to_end(
        settings.kafka, settings.performance_topic, monitoring_pb2.LivePerformance, 30
    )
    return [r.decode() for r in records]


def test_predictions_join_their_truth_once_across_a_kill_mid_stream(
    infra: Infra,
    settings: MonitorSettings,
    launch: list[MonitorProcess],
    tmp_path: Path,
) -> None:
    with BusProducer(infra.kafka, source="tests") as producer:
        for name, version in ((FORECASTER, 1), (FORECASTER, 2), (DIGITS, 1)):
            producer.publish(settings.models_topic, model_ready(version, 0.5, name=name), key=name)
        producer.flush()
    first, rest = before_the_kill(), while_it_is_down()
    # What a joiner that ran through, never killed, settles.
    expected = feed(joiner(), [*first, *rest])
    assert len(expected) == 4 + 14

    monitor = MonitorProcess(infra, settings, tmp_path / "monitor-1.log")
    launch.append(monitor)
    monitor.wait_started()
    publish(infra, settings, first)
    # Eight forecasts and the shadow have their window; two digits their label.
    wait_until(lambda: len(joined(settings)) >= 11, 60, "the first joins were not published")
    monitor.kill()

    publish(infra, settings, rest)
    again = MonitorProcess(infra, settings, tmp_path / "monitor-2.log")
    launch.append(again)
    again.wait_started()
    wait_until(lambda: len(joined(settings)) >= len(expected), 60, "the rest was not settled")
    assert again.terminate() == 0

    settled = joined(settings)
    ids = [s.join_id for s in settled]
    assert len(ids) == len(set(ids)), "a prediction was settled twice"

    def outcomes(events: list[predictions_pb2.PredictionJoined]) -> dict[str, tuple[int, float]]:
        return {e.join_id: (e.outcome, round(e.error, 9)) for e in events}

    assert outcomes(settled) == outcomes(expected)
    by_request = {(s.request_id, s.model_version): s for s in settled}
    late = by_request[("sensor-0-1", "1")]
    assert (late.outcome, late.truth_window_key) == (JOIN_OUTCOME_JOINED, window(0, 2).window_key)
    assert by_request[("sensor-1-5", "1")].outcome == JOIN_OUTCOME_EXPIRED
    shadow = by_request[("sensor-0-0", "2")]
    assert (shadow.role, shadow.truth) == (
        PREDICTION_ROLE_SHADOW,
        by_request[("sensor-0-0", "1")].truth,
    )

    latest = {(p.model_name, p.model_version): p for p in performance(settings)}
    forecasts = [s for s in settled if s.model_name == FORECASTER and s.model_version == "1"]
    errors = np.array([s.error for s in forecasts if s.outcome == JOIN_OUTCOME_JOINED])
    live = latest[(FORECASTER, "1")]
    assert (live.joined, live.expired, live.pairs) == (12, 1, 12)
    assert live.mae == pytest.approx(np.abs(errors).mean())
    digits = latest[(DIGITS, "1")]
    # 3 and 5 right, 7 (a 1) and 0 (a 9) wrong.
    assert (digits.metric, digits.joined, digits.mae) == ("error", 4, 0.5)
