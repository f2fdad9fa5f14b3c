"""The monitor's registry and judge, and its handlers on the in-memory bus:
stationary windows give nothing, a shift gives one event with the right
fields, a drifted version is judged again only after its horizon turned
over, and a new champion is judged afresh."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from shared import model_registry
from shared.bus.codec import MessageT
from shared.bus.consumer import Record
from shared.bus.loop import BatchHandler, ConsumeLoop, DeadLetters
from shared.bus.testing import MemoryPublisher, MemorySource, record
from shared.contracts.aistack.v1 import common_pb2, features_pb2, models_pb2, monitoring_pb2
from shared.distribution import training_distribution
from shared.errors import ConfigError
from shared.model_registry import Follower
from shared.settings import ServingPolicy, load_settings
from svc_monitor.champion import Rule
from svc_monitor.drift import Thresholds
from svc_monitor.handlers import ModelsHandler, WindowsHandler
from svc_monitor.horizon import Horizons, Position
from svc_monitor.metrics import MonitorMetrics
from svc_monitor.settings import MonitorSettings
from svc_monitor.watch import Judge, Registry, Verdict, Watched, drift_id

FEATURE = "temperature@tumbling-60s"
MODEL = "forecast"
WINDOWS_TOPIC = "windows"
DRIFT_TOPIC = "drift"
T0_US = 1_700_000_000_000_000
MINUTE_US = 60_000_000
NOW_US = 1_800_000_000_000_000
HORIZON = 60


def draws(shift: float, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Window means N(20 + shift, 2) and standard deviations N(2, 0.2)."""
    rng = np.random.default_rng(seed)
    return rng.normal(20.0 + shift, 2.0, count), np.abs(rng.normal(2.0, 0.2, count))


def distribution(shift: float = 0.0, seed: int = 1) -> models_pb2.TrainingDistribution:
    means, stddevs = draws(shift, 1_000, seed)
    return training_distribution(
        feature=FEATURE,
        metric="temperature",
        window="tumbling-60s",
        statistics={"mean": means, "stddev": stddevs},
        first_window_start_us=T0_US - 10_000 * MINUTE_US,
        last_window_start_us=T0_US - MINUTE_US,
    )


def model_ready(
    version: int,
    val_error: float,
    trained_on: models_pb2.TrainingDistribution | None = None,
    *,
    name: str = MODEL,
) -> models_pb2.ModelReady:
    ready = models_pb2.ModelReady(
        model_name=name,
        version=str(version),
        objective=common_pb2.Objective(metric="val_mae", direction=common_pb2.DIRECTION_MINIMIZE),
        lineage=models_pb2.ModelLineage(study_id=f"study-{version}"),
    )
    ready.metrics["val_mae"] = val_error
    if trained_on is not None:
        ready.training_distribution.CopyFrom(trained_on)
    return ready


def windows(
    first_minute: int, count: int, shift: float = 0.0, seed: int = 7
) -> list[features_pb2.FeatureWindow]:
    """``count`` windows one minute apart, of five sensors in turn."""
    means, stddevs = draws(shift, count, seed + first_minute)
    out = []
    for i in range(count):
        minute = first_minute + i
        window = features_pb2.FeatureWindow(
            window_key=f"sensor-{minute % 5}/temperature/{minute}",
            entity_id=f"sensor-{minute % 5}",
            metric="temperature",
            mean=float(means[i]),
            stddev=float(stddevs[i]),
            count=60,
        )
        window.window_start.FromMicroseconds(T0_US + minute * MINUTE_US)
        window.window_size.FromSeconds(60)
        window.window_slide.FromSeconds(60)
        out.append(window)
    return out


class Watching:
    """The watched versions over a model registry of their own, offered one
    event at a time as the models handler hands the follower's updates on."""

    def __init__(self, policy: ServingPolicy = "champion") -> None:
        self.models = model_registry.Registry()
        self.watch = Registry(self.models, policy)

    def offer(self, event: models_pb2.ModelReady) -> bool:
        return not self.models.add(event) and self.watch.update(event.model_name)

    def watched(self) -> list[Watched]:
        return self.watch.watched()


class Monitor:
    """Registry, horizons and judge, fed as the handlers feed them."""

    def __init__(self, horizon: int = HORIZON) -> None:
        self.registry = Watching()
        self.horizons = Horizons(horizon)
        self.judge = Judge(Thresholds(), horizon, WINDOWS_TOPIC, lambda: NOW_US)
        self.offsets = itertools.count()

    def feed(
        self, batch: list[features_pb2.FeatureWindow]
    ) -> list[tuple[str, str, Verdict, monitoring_pb2.DriftDetected | None]]:
        changed: set[str] = set()
        for window in batch:
            offset = next(self.offsets)
            changed |= set(self.horizons.add(window, Position(offset % 3, offset)))
        return [
            (j.model_name, j.version, j.verdict, j.event)
            for j in self.judge.judge(self.registry.watched(), self.horizons, changed)
        ]

    def feed_in(
        self, all_windows: list[features_pb2.FeatureWindow], size: int
    ) -> Iterator[tuple[str, str, Verdict, monitoring_pb2.DriftDetected | None]]:
        for start in range(0, len(all_windows), size):
            yield from self.feed(all_windows[start : start + size])


def events_of(
    judgements: list[tuple[str, str, Verdict, monitoring_pb2.DriftDetected | None]],
) -> list[monitoring_pb2.DriftDetected]:
    return [event for *_, event in judgements if event is not None]


# ---- the registry ----


def test_the_champion_with_a_distribution_is_watched_on_its_feature() -> None:
    registry = Watching()
    assert registry.offer(model_ready(1, 0.5)) is False  # no distribution: not watched
    assert registry.watched() == []
    assert registry.offer(model_ready(2, 0.4, distribution())) is True
    [watch] = registry.watched()
    assert (watch.model_name, watch.version, watch.feature) == (MODEL, "2", FEATURE)
    assert set(watch.references) == {"mean", "stddev"}
    # A worse version does not serve, so it changes nothing.
    assert registry.offer(model_ready(3, 0.9, distribution(shift=5.0))) is False
    assert registry.watched()[0].version == "2"
    # A better one without a distribution serves, and is not watched.
    assert registry.offer(model_ready(4, 0.1)) is True
    assert registry.watched() == []
    registry.offer(model_ready(1, 0.3, distribution(), name="other"))
    assert [w.model_name for w in registry.watched()] == ["other"]


def test_under_the_latest_policy_the_newest_version_is_watched_as_it_serves() -> None:
    registry = Watching("latest")
    assert registry.offer(model_ready(1, 0.1, distribution())) is True
    # Worse on its objective, yet it serves under "latest": it is the one watched.
    assert registry.offer(model_ready(2, 0.9, distribution(shift=5.0))) is True
    assert registry.watched()[0].version == "2"
    champion = Watching()
    champion.offer(model_ready(1, 0.1, distribution()))
    assert champion.offer(model_ready(2, 0.9, distribution(shift=5.0))) is False
    assert champion.watched()[0].version == "1"


def test_an_event_the_registry_skips_changes_nothing() -> None:
    registry = Watching()
    registry.offer(model_ready(1, 0.5, distribution()))
    bad = model_ready(2, 0.1, distribution())
    bad.version = "v2"
    assert registry.offer(bad) is False
    assert registry.watched()[0].version == "1"


def test_unreadable_references_are_skipped_and_none_left_is_not_watched() -> None:
    broken = distribution()
    del broken.statistics[0].quantiles[3:]
    registry = Watching()
    registry.offer(model_ready(1, 0.5, broken))
    [watch] = registry.watched()
    assert set(watch.references) == {"stddev"}
    del broken.statistics[1].quantiles[3:]
    registry.offer(model_ready(2, 0.4, broken))
    assert registry.watched() == []


# ---- the judge ----


def test_stationary_windows_give_no_event() -> None:
    monitor = Monitor()
    monitor.registry.offer(model_ready(1, 0.5, distribution()))
    judgements = list(monitor.feed_in(windows(0, 600), size=7))
    verdicts = {verdict for _, _, verdict, _ in judgements}
    assert verdicts == {Verdict.STEADY}
    # Judged as soon as min_windows were in, after every batch since.
    assert len(judgements) == len(range(0, 600, 7)) - 2


def test_nothing_is_judged_below_min_windows_or_for_another_feature() -> None:
    monitor = Monitor()
    monitor.registry.offer(model_ready(1, 0.5, distribution()))
    assert monitor.feed(windows(0, 19, shift=10.0)) == []
    other = windows(100, 40, shift=10.0)
    for window in other:
        window.metric = "humidity"
    assert monitor.feed(other) == []


def test_a_shift_gives_one_event_with_what_was_judged() -> None:
    monitor = Monitor()
    serving = model_ready(1, 0.5, distribution())
    monitor.registry.offer(serving)
    assert events_of(monitor.feed(windows(0, HORIZON))) == []
    [event] = events_of(monitor.feed(windows(HORIZON, HORIZON, shift=6.0)))
    assert (event.model_name, event.model_version, event.feature) == (MODEL, "1", FEATURE)
    assert event.study_id == "study-1"
    assert event.serving == serving
    scores = {s.statistic: s for s in event.scores}
    assert set(scores) == {"mean", "stddev"}
    assert scores["mean"].drifted and not scores["stddev"].drifted
    mean = scores["mean"]
    assert mean.psi > 0.25 and mean.ks > mean.ks_critical > 0 and mean.windows == HORIZON
    assert event.thresholds == monitoring_pb2.DriftThresholds(
        psi=0.25, ks=0.2, alpha=0.001, min_windows=20, horizon_windows=HORIZON
    )
    # The horizon judged: the shifted windows, at offsets 60..119 on three partitions.
    assert sum(r.count for r in event.windows) == HORIZON
    assert {r.topic for r in event.windows} == {WINDOWS_TOPIC}
    assert [(r.partition, r.min_offset, r.max_offset) for r in event.windows] == [
        (0, 60, 117),
        (1, 61, 118),
        (2, 62, 119),
    ]
    assert event.first_window_start.ToMicroseconds() == T0_US + HORIZON * MINUTE_US
    assert event.last_window_start.ToMicroseconds() == T0_US + (2 * HORIZON - 1) * MINUTE_US
    assert event.detected_time.ToMicroseconds() == NOW_US
    assert event.drift_id == drift_id(MODEL, "1", FEATURE, event.windows)
    assert event.drift_id != drift_id(MODEL, "2", FEATURE, event.windows)


def test_the_same_windows_give_the_same_drift_id() -> None:
    ids = []
    for _ in range(2):
        monitor = Monitor()
        monitor.registry.offer(model_ready(1, 0.5, distribution()))
        judgements = list(monitor.feed_in(windows(0, 200, shift=6.0), size=10))
        ids.append([event.drift_id for event in events_of(judgements)])
    assert ids[0] == ids[1] and len(ids[0]) >= 1


def test_a_drifted_version_is_judged_again_only_after_the_horizon_turned_over() -> None:
    monitor = Monitor()
    monitor.registry.offer(model_ready(1, 0.5, distribution()))
    monitor.feed(windows(0, HORIZON))
    shifted = windows(HORIZON, 4 * HORIZON, shift=6.0)
    verdicts = []
    events = []
    for window in shifted:
        for _, _, verdict, event in monitor.feed([window]):
            verdicts.append(verdict)
            if event is not None:
                events.append((len(verdicts), event))
    at = [judged for judged, _ in events]
    # Found before the shifted windows fill the horizon; then, in a storm of
    # shifted windows, one event per full turnover of the horizon.
    assert at[0] < HORIZON
    assert at == list(range(at[0], len(shifted) + 1, HORIZON))
    assert set(verdicts[at[0] : at[1] - 1]) == {Verdict.HOLDING}
    assert events[1][1].first_window_start.ToMicroseconds() > (
        events[0][1].last_window_start.ToMicroseconds()
    )


def test_a_new_champion_is_judged_afresh() -> None:
    monitor = Monitor()
    monitor.registry.offer(model_ready(1, 0.5, distribution()))
    monitor.feed(windows(0, HORIZON))
    assert len(events_of(monitor.feed(windows(HORIZON, HORIZON, shift=6.0)))) == 1
    assert {v for _, _, v, _ in monitor.feed(windows(2 * HORIZON, 5, shift=6.0))} == {
        Verdict.HOLDING
    }
    # Version 2, trained on the old data again: the next window judges it at once.
    monitor.registry.offer(model_ready(2, 0.4, distribution(seed=2)))
    [(_, version, verdict, event)] = monitor.feed(windows(2 * HORIZON + 5, 1, shift=6.0))
    assert (version, verdict) == ("2", Verdict.DRIFT)
    assert event is not None and event.model_version == "2"
    # Version 3, trained on the shifted data: the shifted windows are steady for it.
    monitor.registry.offer(model_ready(3, 0.3, distribution(shift=6.0, seed=3)))
    judgements = list(monitor.feed_in(windows(2 * HORIZON + 6, 100, shift=6.0), size=5))
    assert {(version, verdict) for _, version, verdict, _ in judgements} == {("3", Verdict.STEADY)}


def test_events_read_back_after_a_restart_hold_the_version() -> None:
    before = Monitor()
    before.registry.offer(model_ready(1, 0.5, distribution()))
    before.feed(windows(0, HORIZON))
    [event] = events_of(before.feed(windows(HORIZON, HORIZON, shift=6.0)))
    after = Monitor()
    after.registry.offer(model_ready(1, 0.5, distribution()))
    after.judge.remember(event)
    rebuilt = windows(HORIZON, HORIZON + 10, shift=6.0)
    assert {v for _, _, v, _ in after.feed(rebuilt[:HORIZON])} == {Verdict.HOLDING}
    # Another version of the model is not held by it.
    other = Monitor()
    other.registry.offer(model_ready(2, 0.5, distribution()))
    other.judge.remember(event)
    assert {v for _, _, v, _ in other.feed(rebuilt[:HORIZON])} == {Verdict.DRIFT}


# ---- the handlers on the in-memory bus ----


class Bus:
    def __init__(self, horizon: int = HORIZON) -> None:
        self.prometheus = CollectorRegistry()
        self.metrics = MonitorMetrics.create(self.prometheus)
        self.publisher = MemoryPublisher()
        self.models_registry = model_registry.Registry()
        self.registry = Registry(self.models_registry)
        self.horizons = Horizons(horizon)
        judge = Judge(Thresholds(), horizon, WINDOWS_TOPIC, lambda: NOW_US)
        self.dead_letters = DeadLetters(
            self.publisher, topic="dlq", service="test", counter=self.metrics.dead_letters
        )
        self.models = ModelsHandler(self.registry, self.metrics)
        self.windows = WindowsHandler(
            self.horizons, self.registry, judge, self.publisher, DRIFT_TOPIC, self.metrics
        )
        self.offsets = itertools.count()

    def models_loop(self, *events: models_pb2.ModelReady | bytes) -> None:
        records = [record(models_pb2.ModelReady, e, topic="models") for e in events]
        follower = Follower(
            MemorySource(records),
            topic="models",
            publisher=self.publisher,
            dead_letters=self.dead_letters,
            registry=self.models_registry,
        )
        self.models(follower.step())

    def windows_loop(self, batch: Sequence[features_pb2.FeatureWindow | bytes]) -> None:
        records: list[Record[features_pb2.FeatureWindow]] = []
        for window in batch:
            offset = next(self.offsets)
            records.append(
                record(
                    features_pb2.FeatureWindow,
                    window,
                    topic=WINDOWS_TOPIC,
                    partition=offset % 3,
                    offset=offset,
                )
            )
        self._run(records, self.windows)

    def _run(self, records: list[Record[MessageT]], handler: BatchHandler[MessageT]) -> None:
        loop = ConsumeLoop(
            MemorySource(records),
            handler,
            publisher=self.publisher,
            dead_letters=self.dead_letters,
            max_records=len(records) or 1,
        )
        loop.step()

    def metric(self, name: str, **labels: str) -> float:
        value = self.prometheus.get_sample_value(f"aistack_{name}", labels)
        return 0.0 if value is None else float(value)


def test_the_handlers_publish_one_event_keyed_by_model_and_count_what_they_did() -> None:
    bus = Bus()
    bus.models_loop(model_ready(1, 0.5, distribution()), model_ready(1, 0.5, distribution()))
    assert bus.metric("monitor_watched_models") == 1.0
    stationary = windows(0, HORIZON)
    bus.windows_loop([*stationary, stationary[0]])
    assert bus.publisher.messages(DRIFT_TOPIC) == []
    assert bus.metric("monitor_windows_total", outcome="new") == HORIZON
    assert bus.metric("monitor_windows_total", outcome="repeated") == 1
    assert bus.metric("monitor_judgements_total", model=MODEL, verdict="steady") == 1
    bus.windows_loop([*windows(HORIZON, HORIZON, shift=6.0), b"not a window"])
    [published] = [p for p in bus.publisher.delivered if p.topic == DRIFT_TOPIC]
    assert isinstance(published.message, monitoring_pb2.DriftDetected)
    assert published.key == MODEL.encode()
    assert (b"ce_id", published.message.drift_id.encode()) in [
        (k.encode(), v) for k, v in published.headers
    ]
    assert bus.metric("monitor_drift_events_total", model=MODEL) == 1
    assert bus.metric("monitor_judgements_total", model=MODEL, verdict="drift") == 1
    assert bus.metric("monitor_dead_letters_total", reason="invalid_protobuf") == 1
    bus.windows_loop(windows(0, 5))  # older than the full horizon
    assert bus.metric("monitor_windows_total", outcome="late") == 5


def test_the_models_handler_passes_over_skipped_events_and_dead_letters_non_models() -> None:
    bus = Bus()
    bad = model_ready(2, 0.1, distribution(shift=5.0))
    bad.version = "v2"
    bus.models_loop(model_ready(1, 0.5, distribution()), bad, b"not a model")
    bus.publisher.flush()
    assert [w.version for w in bus.registry.watched()] == ["1"]
    assert bus.metric("monitor_watched_models") == 1.0
    assert bus.metric("monitor_dead_letters_total", reason="invalid_protobuf") == 1
    bus.models_loop(model_ready(2, 0.4))  # serves, without a distribution
    assert bus.metric("monitor_watched_models") == 0.0


def test_while_rebuilding_nothing_is_judged_until_judge_pending() -> None:
    bus = Bus()
    bus.models_loop(model_ready(1, 0.5, distribution()))
    bus.windows.judging = False
    bus.windows_loop(windows(0, HORIZON, shift=6.0))
    bus.windows_loop(windows(HORIZON, 10, shift=6.0))
    assert bus.publisher.messages(DRIFT_TOPIC) == []
    assert bus.metric("monitor_judgements_total", model=MODEL, verdict="drift") == 0
    bus.windows.judging = True
    bus.windows.judge_pending()
    bus.publisher.flush()
    assert len(bus.publisher.messages(DRIFT_TOPIC)) == 1
    bus.windows.judge_pending()  # nothing new since
    assert bus.metric("monitor_judgements_total", model=MODEL, verdict="drift") == 1


# ---- settings ----


def test_settings_defaults_and_a_horizon_smaller_than_min_windows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = MonitorSettings()
    assert settings.thresholds() == Thresholds(psi=0.25, ks=0.2, alpha=0.001, min_windows=20)
    assert (settings.horizon_windows, settings.metrics_port) == (120, 9107)
    assert [spec.name for spec in settings.topic_specs()] == [
        "aistack.models.ready",
        "aistack.features.windows",
        "aistack.monitoring.drift",
        "aistack.predictions",
        "aistack.labels",
        "aistack.predictions.joined",
        "aistack.monitoring.performance",
        "aistack.models.decisions",
        "aistack.events.dlq",
    ]
    assert settings.rule() == Rule(min_pairs=200, alpha=0.01, margin=0.5)
    monkeypatch.setenv("AISTACK_MONITOR_HORIZON_WINDOWS", "10")
    with pytest.raises(ConfigError, match="AISTACK_MONITOR_MIN_WINDOWS"):
        load_settings(MonitorSettings)
    monkeypatch.setenv("AISTACK_MONITOR_HORIZON_WINDOWS", "many")
    with pytest.raises(ConfigError, match="AISTACK_MONITOR_HORIZON_WINDOWS"):
        load_settings(MonitorSettings)


def test_a_bad_setting_stops_the_service_with_one_line() -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("AISTACK_")}
    env["AISTACK_MONITOR_ALPHA"] = "2"
    done = subprocess.run(
        [sys.executable, "-m", "svc_monitor"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("svc_monitor: bad setting AISTACK_MONITOR_ALPHA")
