"""demo.live: the re-tuned version judged on live traffic in the demo's loop."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from demo.live import DEMO_SETTINGS, ROUNDS, Latest, current, truth_readings
from shared.settings import ServingSettings
from svc_ingest.cleaner import Cleaner
from svc_ingest.rules import CleaningRules
from svc_monitor.settings import MonitorSettings

MINUTE = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def test_the_sensors_of_this_run_are_those_near_the_newest_window() -> None:
    windows = {
        "probe-1": Latest(MINUTE, 35.0),
        "air-2": Latest(MINUTE - timedelta(minutes=2), 31.0),
        "probe-old": Latest(MINUTE - timedelta(hours=3), 20.0),  # an earlier run's
    }
    assert sorted(current(windows)) == ["air-2", "probe-1"]
    assert current({}) == {}


def test_each_sensor_gets_readings_of_the_minute_it_was_forecast_for_and_one_closes_them() -> None:
    windows = {
        "probe-1": Latest(MINUTE, 35.0),
        "air-2": Latest(MINUTE - timedelta(minutes=1), 31.0),
    }
    records = truth_readings(windows, seed=1)
    cleaner = Cleaner(CleaningRules())
    now_us = int((MINUTE + timedelta(minutes=2)).timestamp() * 1_000_000)
    events = [
        cleaner.clean(r.value, r.key, "application/json", now_us) for r in records
    ]  # svc_ingest's own cleaning: every reading is a good one
    by_entity: dict[str, list[datetime]] = {}
    for event in events:
        [measurement] = event.sensor_reading.measurements
        assert measurement.metric == "temperature"
        moment = event.event_time.ToDatetime(UTC)
        by_entity.setdefault(event.entity_id, []).append(moment)
    probe = sorted(by_entity["probe-1"])
    # Three in the minute after 12:00, then the one that closes every minute sent.
    assert all(MINUTE < m < MINUTE + timedelta(minutes=1) for m in probe[:3])
    assert probe[3] >= MINUTE + timedelta(seconds=60 + 30)
    assert all(MINUTE - timedelta(minutes=1) < m < MINUTE for m in by_entity["air-2"])
    assert len({r.event_id for r in records}) == len(records) == 3 + 3 + 1
    assert truth_readings(windows, seed=1) == records  # the same run sends the same


def test_the_demos_settings_are_valid_and_judge_within_its_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in DEMO_SETTINGS.items():
        monkeypatch.setenv(name, value)
    assert ServingSettings().policy == "live"
    monitor = MonitorSettings()
    # A round forecasts every sensor with the feature (38 of the 48 the
    # loadgen fleet has): the rule has its pairs within the first rounds, and
    # the rounds' windows stay under the drift horizon.
    assert monitor.champion_min_pairs <= 38
    assert ROUNDS * (48 + 1) < monitor.horizon_windows  # each sensor's minute, the closing one
