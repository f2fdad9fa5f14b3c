"""svc_monitor's joiner: logged forecasts joined with the window they
predict, by event time (a late window within the lateness joins, one beyond
it does not and its forecast expires), classifiers' predictions with users'
labels, each prediction settled once, a restart that reads its own output
back settling only the rest, and each version's live error."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from shared import model_registry
from shared.bus.codec import MessageT
from shared.bus.loop import Batch, DeadLetters, Received
from shared.bus.testing import MemoryPublisher, record
from shared.contracts.aistack.v1 import features_pb2, monitoring_pb2, predictions_pb2
from shared.contracts.aistack.v1.predictions_pb2 import (
    JOIN_OUTCOME_EXPIRED,
    JOIN_OUTCOME_JOINED,
    PREDICTION_ROLE_CHAMPION,
    PREDICTION_ROLE_SHADOW,
    TRUTH_SOURCE_LABEL,
    TRUTH_SOURCE_WINDOW,
    PredictionJoined,
)
from shared.feature_store import FEATURE_LABEL, forecast_label
from svc_monitor.deciding import Deciding
from svc_monitor.join import CLASS_ERROR, MAE, Forecast, Joiner, join_id
from svc_monitor.joining import JoinHandler, forecasts
from svc_monitor.metrics import MonitorMetrics
from svc_monitor.performance import LEVELS, Performance
from svc_monitor.settings import MonitorSettings
from tests.unit.test_monitor_watch import MINUTE_US, T0_US, model_ready

FORECASTER = "forecast"
DIGITS = "digits"
SECOND_US = 1_000_000
LATENESS_US = 2 * MINUTE_US


def truth_window(
    minute: int, mean: float, *, entity: str = "sensor-1", p95: float = 0.0, size_minutes: int = 1
) -> features_pb2.FeatureWindow:
    """The closed temperature window of ``entity`` starting ``minute``
    minutes after T0."""
    window = features_pb2.FeatureWindow(
        window_key=f"{entity}/temperature/{minute}/{size_minutes}",
        entity_id=entity,
        metric="temperature",
        mean=mean,
        p95=p95,
        count=60,
    )
    window.window_start.FromMicroseconds(T0_US + minute * MINUTE_US)
    window.window_end.FromMicroseconds(T0_US + (minute + size_minutes) * MINUTE_US)
    window.window_size.FromSeconds(60 * size_minutes)
    window.window_slide.FromSeconds(60)
    return window


def forecast(
    request: str,
    fed_minute: int,
    value: float,
    *,
    entity: str = "sensor-1",
    version: str = "1",
    role: predictions_pb2.PredictionRole = PREDICTION_ROLE_CHAMPION,
    size_minutes: int = 1,
) -> predictions_pb2.PredictionLogged:
    """A forecast fed ``entity``'s window starting ``fed_minute``, as svc_model logs it."""
    fed = truth_window(fed_minute, 0.0, entity=entity, size_minutes=size_minutes)
    logged = predictions_pb2.PredictionLogged(
        request_id=request,
        model_name=FORECASTER,
        model_version=version,
        entity_id=entity,
        window_key=fed.window_key,
        window_metric="temperature",
        outputs=[predictions_pb2.OutputValues(name="y", values=[value])],
        role=role,
    )
    logged.window_start.CopyFrom(fed.window_start)
    logged.window_end.CopyFrom(fed.window_end)
    logged.served_time.CopyFrom(fed.window_end)
    return logged


def digits_prediction(
    request: str,
    digit: int,
    *,
    version: str = "1",
    role: predictions_pb2.PredictionRole = PREDICTION_ROLE_CHAMPION,
    served_second: int = 0,
) -> predictions_pb2.PredictionLogged:
    """The digits model's output for one image: ten class probabilities,
    ``digit`` the most probable."""
    probabilities = np.full(10, 0.02)
    probabilities[digit] = 0.82
    logged = predictions_pb2.PredictionLogged(
        request_id=request,
        model_name=DIGITS,
        model_version=version,
        inputs_sha256="ab" * 32,
        outputs=[predictions_pb2.OutputValues(name="probabilities", values=probabilities)],
        role=role,
    )
    logged.served_time.FromMicroseconds(T0_US + served_second * SECOND_US)
    return logged


def label(request: str, digit: int, second: int) -> predictions_pb2.Label:
    truth = predictions_pb2.Label(request_id=request, model_name=DIGITS, value=digit)
    truth.event_time.FromMicroseconds(T0_US + second * SECOND_US)
    return truth


def joiner(
    resolve: dict[str, Forecast] | None = None, label_lateness_us: int = 60 * SECOND_US
) -> Joiner:
    known = resolve or {}
    return Joiner(
        LATENESS_US, label_lateness_us, lambda name, version: known.get(version, Forecast())
    )


Input = predictions_pb2.PredictionLogged | features_pb2.FeatureWindow | predictions_pb2.Label


def feed(j: Joiner, inputs: Iterable[Input]) -> list[PredictionJoined]:
    out: list[PredictionJoined] = []
    for item in inputs:
        if isinstance(item, predictions_pb2.PredictionLogged):
            out.extend(j.prediction(item))
        elif isinstance(item, features_pb2.FeatureWindow):
            out.extend(j.window(item))
        else:
            out.extend(j.label(item))
    return out


def by_request(settled: Sequence[PredictionJoined]) -> dict[str, PredictionJoined]:
    found = {s.request_id: s for s in settled}
    assert len(found) == len(settled), "a prediction was settled twice"
    return found


# ---- forecasts and windows ----


def test_a_forecast_joins_the_next_window_of_its_series_and_no_other() -> None:
    j = joiner()
    assert j.prediction(forecast("r1", 0, 21.5)) == []
    others = [
        truth_window(1, 30.0, entity="sensor-2"),  # another entity
        truth_window(0, 30.0),  # the window it was fed
        truth_window(2, 30.0),  # one too far
        truth_window(1, 30.0, size_minutes=2),  # another window kind
    ]
    assert feed(j, others) == []
    [joined] = j.window(truth_window(1, 20.0))
    assert joined.outcome == JOIN_OUTCOME_JOINED
    assert joined.source == TRUTH_SOURCE_WINDOW
    assert (joined.metric, joined.statistic) == (MAE, "mean")
    assert (joined.prediction, joined.truth, joined.error) == (21.5, 20.0, 1.5)
    assert joined.truth_window_key == "sensor-1/temperature/1/1"
    assert joined.truth_time.ToMicroseconds() == T0_US + 2 * MINUTE_US
    assert joined.join_id == join_id(forecast("r1", 0, 21.5))
    assert j.pending == 0


def test_a_window_read_before_its_forecast_joins_it_too() -> None:
    j = joiner()
    assert j.window(truth_window(1, 20.0)) == []
    [joined] = j.prediction(forecast("r1", 0, 19.0))
    assert (joined.outcome, joined.error) == (JOIN_OUTCOME_JOINED, -1.0)


def test_a_late_window_within_the_lateness_joins_and_one_beyond_it_does_not() -> None:
    j = joiner()
    feed(j, [forecast("lost", 0, 20.0), forecast("late", 3, 20.0)])
    # Another sensor's windows up to minute 5 (ending at 6): watermark 6 - 2 = 4.
    [expired] = feed(j, [truth_window(m, 0.0, entity="sensor-9") for m in range(1, 6)])
    # "lost" waited for minute 1 (ending at 2 < 4): expired, and its window,
    # arriving now, is too late to join anything.
    assert (expired.request_id, expired.outcome) == ("lost", JOIN_OUTCOME_EXPIRED)
    assert j.window(truth_window(1, 20.0)) == []
    # "late" waits for minute 4 (ending at 5 >= 4): two minutes behind the
    # latest window, within the lateness, it joins.
    [joined] = j.window(truth_window(4, 21.0))
    assert (joined.request_id, joined.outcome, joined.error) == ("late", JOIN_OUTCOME_JOINED, -1.0)
    assert j.pending == 0


def test_the_watermark_expires_a_forecast_and_drops_its_window_when_it_comes() -> None:
    observed: list[tuple[str, str]] = []
    j = Joiner(
        LATENESS_US, 0, lambda name, version: Forecast(), lambda k, o: observed.append((k, o))
    )
    assert j.prediction(forecast("r1", 0, 20.0)) == []
    # Minute 3 ends at 4: the watermark is 4 - 2 = 2, the truth's end (2) is not behind it.
    assert j.window(truth_window(3, 0.0, entity="sensor-2")) == []
    [expired] = j.window(truth_window(4, 0.0, entity="sensor-2"))  # watermark 3
    assert expired.outcome == JOIN_OUTCOME_EXPIRED
    assert not expired.HasField("truth_window_start") and expired.error == 0.0
    assert expired.watermark.ToMicroseconds() == T0_US + 3 * MINUTE_US
    assert j.window(truth_window(1, 20.0)) == []  # ends at 2 < 3: too late
    assert ("window", "late") in observed
    # A forecast whose truth is already behind the watermark expires at once.
    [at_once] = j.prediction(forecast("r2", 0, 20.0))
    assert at_once.outcome == JOIN_OUTCOME_EXPIRED
    assert j.pending == 0


def test_each_prediction_is_settled_once_and_a_repeated_window_changes_nothing() -> None:
    j = joiner()
    prediction = forecast("r1", 0, 21.0)
    assert feed(j, [prediction, prediction]) == []
    assert j.pending == 1
    assert len(feed(j, [truth_window(1, 20.0), truth_window(1, 20.0)])) == 1
    assert feed(j, [prediction, truth_window(1, 20.0)]) == []


def test_champion_and_shadow_of_one_request_both_join_the_same_window() -> None:
    j = joiner()
    champion = forecast("r1", 0, 21.0, version="1")
    shadow = forecast("r1", 0, 19.5, version="2", role=PREDICTION_ROLE_SHADOW)
    feed(j, [champion, shadow])
    settled = j.window(truth_window(1, 20.0))
    assert [(s.model_version, s.role, s.error) for s in settled] == [
        ("1", PREDICTION_ROLE_CHAMPION, 1.0),
        ("2", PREDICTION_ROLE_SHADOW, -0.5),
    ]
    assert len({s.join_id for s in settled}) == 2


def test_the_registry_says_which_statistic_and_window_kind_a_version_forecasts() -> None:
    models = model_registry.Registry()
    sliding = model_ready(2, 0.5)
    sliding.lineage.data.label = forecast_label("p95", "temperature")
    sliding.labels[FEATURE_LABEL] = "temperature@sliding-300s-every-60s"
    models.add(model_ready(1, 0.5))
    models.add(sliding)
    resolve = forecasts(models)
    assert resolve(FORECASTER, "1") == Forecast("mean", None)
    assert resolve(FORECASTER, "2") == Forecast("p95", MINUTE_US)
    assert resolve(FORECASTER, "9") == Forecast()  # not (yet) in the registry
    j = Joiner(LATENESS_US, 0, resolve)
    # A five-minute window slid by one: the truth starts one minute later.
    j.prediction(forecast("r1", 0, 30.0, version="2", size_minutes=5))
    assert j.window(truth_window(2, 20.0, p95=29.0, size_minutes=5)) == []
    [joined] = j.window(truth_window(1, 20.0, p95=29.0, size_minutes=5))
    assert (joined.statistic, joined.truth, joined.error) == ("p95", 29.0, 1.0)


def stream() -> list[Input]:
    """Forecasts of three sensors, a minute apart, their truth windows a
    minute later, one window arriving late within the lateness and one
    beyond it."""
    items: list[Input] = []
    late_ok = truth_window(4, 10.4, entity="sensor-0")
    for minute in range(12):
        for sensor in range(3):
            entity = f"sensor-{sensor}"
            items.append(forecast(f"{entity}-{minute}", minute, 10.0 + sensor, entity=entity))
            if minute >= 1 and (entity, minute) not in {("sensor-0", 4), ("sensor-1", 2)}:
                items.append(truth_window(minute, 10.0 + sensor + minute / 10, entity=entity))
        if minute == 5:
            items.append(late_ok)  # two minutes late: within LATENESS_US
        if minute == 9:
            items.append(truth_window(2, 11.2, entity="sensor-1"))  # far too late
    return items


def test_a_restarted_joiner_settles_each_prediction_once_as_one_that_ran_through() -> None:
    items = stream()
    whole = by_request(feed(joiner(), items))
    assert whole["sensor-0-3"].outcome == JOIN_OUTCOME_JOINED  # the late window
    assert whole["sensor-1-1"].outcome == JOIN_OUTCOME_EXPIRED  # the one too late
    for cut in (7, len(items) // 2, len(items) - 3):
        before = feed(joiner(), items[:cut])
        restarted = joiner()
        for joined in before:
            assert restarted.remember(joined)
        assert not restarted.remember(before[0])
        # The replay: predictions of the lookback first, then the truths,
        # the watermark held; here one sensor's windows (a partition) read
        # to its end before the next is read at all.
        predictions = [i for i in items if isinstance(i, predictions_pb2.PredictionLogged)]
        restarted.holding = True
        after = feed(restarted, predictions)
        for sensor in ("sensor-0", "sensor-1", "sensor-2"):
            for item in items:
                if isinstance(item, features_pb2.FeatureWindow) and item.entity_id == sensor:
                    after.extend(restarted.window(item, partition=int(sensor[-1])))
        after.extend(restarted.release())
        both = by_request([*before, *after])
        assert both.keys() == whole.keys()
        assert {r: (s.outcome, s.error) for r, s in both.items()} == {
            r: (s.outcome, s.error) for r, s in whole.items()
        }
        assert all(s.join_id == whole[r].join_id for r, s in both.items())


def test_the_watermark_is_the_least_of_the_partitions_and_holds_while_replaying() -> None:
    j = joiner()
    j.prediction(forecast("r1", 0, 21.0, entity="sensor-2"))
    # Partition 0 far ahead; partition 1 behind: the watermark is partition 1's.
    assert j.window(truth_window(0, 0.0, entity="sensor-1"), partition=1) == []
    assert j.window(truth_window(9, 0.0, entity="sensor-0"), partition=0) == []
    assert j.watermark_us(TRUTH_SOURCE_WINDOW) == T0_US + MINUTE_US - LATENESS_US
    [joined] = j.window(truth_window(1, 20.0, entity="sensor-2"), partition=2)
    assert joined.outcome == JOIN_OUTCOME_JOINED
    held = joiner()
    held.holding = True
    held.prediction(forecast("r1", 0, 21.0, entity="sensor-2"))
    assert held.window(truth_window(9, 0.0, entity="sensor-0")) == []
    assert held.watermark_us(TRUTH_SOURCE_WINDOW) is None
    [expired] = held.release()
    assert (expired.outcome, held.watermark_us(TRUTH_SOURCE_WINDOW)) == (
        JOIN_OUTCOME_EXPIRED,
        T0_US + 10 * MINUTE_US - LATENESS_US,
    )


# ---- labels: the digits model ----


def test_digits_predictions_join_the_labels_users_publish() -> None:
    j = joiner()
    feed(j, [digits_prediction("a", 3), digits_prediction("b", 7, served_second=1)])
    [right] = j.label(label("a", 3, 5))
    [wrong] = j.label(label("b", 1, 6))
    assert (right.source, right.metric) == (TRUTH_SOURCE_LABEL, CLASS_ERROR)
    assert (right.prediction, right.truth, right.error) == (3.0, 3.0, 0.0)
    assert (wrong.prediction, wrong.truth, wrong.error) == (7.0, 1.0, 1.0)
    assert wrong.truth_time.ToMicroseconds() == T0_US + 6 * SECOND_US
    # A label published before its prediction was logged joins it too.
    assert j.label(label("c", 4, 7)) == []
    [early] = j.prediction(digits_prediction("c", 4, served_second=2))
    assert early.error == 0.0


def test_a_labelled_prediction_expires_once_the_labels_watermark_passes_it() -> None:
    j = joiner(label_lateness_us=10 * SECOND_US)
    feed(
        j, [digits_prediction("a", 3, served_second=0), digits_prediction("b", 3, served_second=30)]
    )
    [expired] = j.label(label("other", 1, 15))  # watermark 5 s
    assert (expired.request_id, expired.outcome) == ("a", JOIN_OUTCOME_EXPIRED)
    assert j.label(label("a", 3, 4)) == []  # 4 s < 5 s: late
    assert j.pending == 1


def test_a_prediction_without_a_usable_output_is_not_joined() -> None:
    observed: list[tuple[str, str]] = []
    j = Joiner(0, 0, lambda n, v: Forecast(), lambda k, o: observed.append((k, o)))
    empty = digits_prediction("a", 3)
    del empty.outputs[:]
    assert j.prediction(empty) == [] and j.pending == 0
    assert observed == [("prediction", "unusable")]


# ---- live errors ----


def test_a_versions_live_error_covers_its_latest_joins_and_counts_every_settlement() -> None:
    performance = Performance(horizon=4)
    errors = [1.0, -2.0, 3.0, -4.0, 5.0]
    j = joiner()
    for i, error in enumerate(errors):
        j.prediction(forecast(f"r{i}", 0, 20.0 + error))
    for joined in j.window(truth_window(1, 20.0)):
        performance.add(joined)
    j.prediction(forecast("gone", 5, 1.0))
    [expired] = j.window(truth_window(9, 0.0, entity="x"))
    performance.add(expired)
    summary = performance.summary((FORECASTER, "1"), T0_US)
    assert (summary.joined, summary.expired, summary.pairs) == (5, 1, 4)
    assert summary.metric == MAE
    assert summary.mae == pytest.approx(np.mean(np.abs(errors[1:])))
    assert summary.mean_error == pytest.approx(np.mean(errors[1:]))
    assert list(summary.levels) == list(LEVELS)
    assert (summary.quantiles[0], summary.quantiles[-1]) == (-4.0, 5.0)
    assert list(summary.roles) == [PREDICTION_ROLE_CHAMPION]
    assert summary.first_truth_time.ToMicroseconds() == T0_US + 2 * MINUTE_US
    assert summary.performance_id == performance.summary((FORECASTER, "1"), 0).performance_id


def test_the_digits_error_rate_is_its_live_error() -> None:
    performance = Performance(horizon=100)
    j = joiner()
    for i, (guess, truth) in enumerate([(3, 3), (7, 1), (5, 5), (0, 0)]):
        j.prediction(digits_prediction(str(i), guess))
        for joined in j.label(label(str(i), truth, 1)):
            performance.add(joined)
    summary = performance.summary((DIGITS, "1"), T0_US)
    assert (summary.metric, summary.pairs, summary.mae) == (CLASS_ERROR, 4, 0.25)


# ---- the handler ----


class JoinBus:
    def __init__(self, interval_seconds: float = 0.0) -> None:
        self.now_us = T0_US
        self.prometheus = CollectorRegistry()
        metrics = MonitorMetrics.create(self.prometheus)
        self.publisher = MemoryPublisher()
        self.settings = MonitorSettings(
            joined_topic="joined",
            performance_topic="performance",
            performance_interval_seconds=interval_seconds,
        )
        self.dead_letters = DeadLetters(self.publisher, topic="dlq", service="test")
        self.handler = JoinHandler(
            joiner(),
            Performance(10),
            Deciding(self.settings, self.publisher, model_registry.Registry(), metrics),
            self.publisher,
            self.settings,
            metrics,
            lambda: self.now_us,
        )
        self.offsets = itertools.count()

    def batch(self, *messages: MessageT) -> Batch[MessageT]:
        return Batch(
            [Received(m, record(type(m), m, offset=next(self.offsets))) for m in messages],
            self.dead_letters,
        )

    def metric(self, name: str, **labels: str) -> float:
        value = self.prometheus.get_sample_value(f"aistack_{name}", labels)
        return 0.0 if value is None else float(value)


def test_the_handler_publishes_each_settlement_under_its_join_id_and_throttles_summaries() -> None:
    bus = JoinBus(interval_seconds=10)
    bus.handler.predictions(bus.batch(forecast("r1", 0, 21.0), forecast("r2", 1, 21.0)))
    assert bus.metric("monitor_predictions_pending") == 2
    bus.handler.windows(bus.batch(truth_window(1, 20.0)))
    [joined] = [p for p in bus.publisher.queued if p.topic == "joined"]
    assert isinstance(joined.message, PredictionJoined)
    assert joined.key == FORECASTER.encode()
    assert ("ce_id", joined.message.join_id.encode()) in joined.headers
    assert bus.metric("monitor_predictions_settled_total", model=FORECASTER, outcome="joined") == 1
    bus.handler.windows(bus.batch(truth_window(2, 20.0)))
    summaries = [p for p in bus.publisher.queued if p.topic == "performance"]
    assert len(summaries) == 1  # the second join came within the interval
    assert bus.metric("monitor_performance_events_total", model=FORECASTER) == 1
    bus.now_us += 10 * SECOND_US
    assert bus.handler.publish_due() == 1
    assert bus.handler.publish_due() == 0
    last = [p.message for p in bus.publisher.queued if p.topic == "performance"][-1]
    assert isinstance(last, monitoring_pb2.LivePerformance)
    assert (last.joined, last.pairs, last.mae) == (2, 2, 1.0)
    # Read back after a restart, its own settlements count once.
    restarted = JoinBus()
    for p in bus.publisher.queued:
        if isinstance(p.message, PredictionJoined):
            restarted.handler.remember(p.message)
            restarted.handler.remember(p.message)
    assert restarted.handler.performance.summary((FORECASTER, "1"), 0).joined == 2
