"""Logged predictions joined with their truth, by event time. Pure: no bus.

A forecast (a prediction by entity: svc_model fed it a feature window) is
judged by the window after the one it was fed: the same entity, metric,
dimensions and window kind, starting one slide later (svc_trainer's
``features`` dataset trains on exactly that target). Its version's lineage
names the statistic (``shared.feature_store.forecast_statistic``) and its
feature label the window kind; "mean" and a tumbling window where they do not.
Any other prediction is judged by the ``Label`` users publish under its
request id and model.

Each truth stream (windows, labels) has a watermark: the latest truth time
seen (a window's end, a label's event time) less the lateness allowed, taken
per partition and the least of them (as Flink's sources do): a partition
read ahead of the others, as a replay reads them unevenly, does not make the
others' truths late; it never goes back. While the joiner replays its
lookback (``holding``), the watermark holds at the highest it had published:
a partition not read yet would otherwise count for nothing, and one read to
its end expire what another partition's truths would join; ``release``
moves it on when the replay is done; meanwhile a truth is late by its own
partition's latest. A
truth at or after the watermark is taken and kept until the watermark passes
it; one older than the watermark is late and dropped. A prediction waits for
its truth until the watermark passes the truth's time (a forecast: its
target window's end; a labelled prediction: when it was served), then is
settled as expired. So a late truth joins exactly when it is within the
lateness, whichever arrived first, the prediction or its truth.

Each prediction is settled once, under its join id (``join_id``):
``remember`` takes the joiner's own earlier output, read back at start, so
that a restarted joiner, replaying the predictions and truths of its
lookback, settles only what was not settled yet, from the highest watermark
it had published.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from google.protobuf.timestamp_pb2 import Timestamp

from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.contracts.aistack.v1.predictions_pb2 import (
    JOIN_OUTCOME_EXPIRED,
    JOIN_OUTCOME_JOINED,
    TRUTH_SOURCE_LABEL,
    TRUTH_SOURCE_WINDOW,
    JoinOutcome,
    Label,
    PredictionJoined,
    PredictionLogged,
    TruthSource,
)

#: The error metric of values (error = prediction - truth) and of classes
#: (0 when the most probable class is the true one, else 1).
MAE, CLASS_ERROR = "mae", "error"
DEFAULT_STATISTIC = "mean"
_NEVER = -(2**63)


@dataclass(frozen=True)
class Forecast:
    """What a model version predicts of the windows: a statistic of the
    window ``slide_us`` after the one it is fed (None: the fed window's
    size, a tumbling window)."""

    statistic: str = DEFAULT_STATISTIC
    slide_us: int | None = None


#: A model version's Forecast, by (model name, version).
Resolve = Callable[[str, str], Forecast]
#: Told what became of each input: (kind, outcome), e.g. ("window", "late").
Observe = Callable[[str, str], None]


def join_id(prediction: PredictionLogged) -> str:
    """The settled prediction's id: one per (model, version, role, request)."""
    text = "\0".join(
        (
            prediction.model_name,
            prediction.model_version,
            str(prediction.role),
            prediction.request_id,
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def predicted(prediction: PredictionLogged) -> tuple[float, bool] | None:
    """(value, is a class) of a one-row prediction's first output: its one
    value, or the most probable class's index of class probabilities; None
    for an output of neither shape."""
    if not prediction.outputs:
        return None
    values = prediction.outputs[0].values
    if len(values) == 1:
        return float(values[0]), False
    if len(values) > 1:
        return float(max(range(len(values)), key=values.__getitem__)), True
    return None


def is_forecast(prediction: PredictionLogged) -> bool:
    return bool(prediction.entity_id and prediction.window_key) and prediction.HasField(
        "window_start"
    )


WindowKey = tuple[str, str, tuple[tuple[str, str], ...], int, int]


def window_key(
    entity: str, metric: str, dimensions: dict[str, str], size_us: int, start_us: int
) -> WindowKey:
    """A window's place in its series: entity, metric, dimensions, size, start."""
    return (entity, metric, tuple(sorted(dimensions.items())), size_us, start_us)


class _Waiting(NamedTuple):
    prediction: PredictionLogged
    join_id: str
    value: float
    is_class: bool
    statistic: str
    # When the truth happens: the prediction expires once the watermark passes it.
    due_us: int


@dataclass
class _Stream:
    """One truth stream's watermark, truths kept and predictions waiting."""

    lateness_us: int
    watermark_us: int = _NEVER
    truths: dict[Hashable, tuple[int, FeatureWindow | Label]] = field(default_factory=dict)
    waiting: dict[Hashable, list[_Waiting]] = field(default_factory=dict)
    # (time, key) heaps, for eviction by the watermark; entries may be stale.
    truth_times: list[tuple[int, Hashable]] = field(default_factory=list)
    due_times: list[tuple[int, Hashable]] = field(default_factory=list)
    # The latest truth time read from each partition.
    latest_us: dict[int, int] = field(default_factory=dict)

    def advance(self, truth_us: int, partition: int, *, holding: bool) -> None:
        self.latest_us[partition] = max(self.latest_us.get(partition, _NEVER), truth_us)
        if not holding:
            self.release()

    def release(self) -> None:
        if self.latest_us:
            least = min(self.latest_us.values()) - self.lateness_us
            self.watermark_us = max(self.watermark_us, least)


class Joiner:
    """Settles logged predictions: ``prediction``, ``window`` and ``label``
    each return the PredictionJoined events their input settled."""

    def __init__(
        self,
        window_lateness_us: int,
        label_lateness_us: int,
        resolve: Resolve,
        observe: Observe = lambda kind, outcome: None,
    ) -> None:
        self._streams = {
            TRUTH_SOURCE_WINDOW: _Stream(window_lateness_us),
            TRUTH_SOURCE_LABEL: _Stream(label_lateness_us),
        }
        self._resolve = resolve
        self._observe = observe
        self._settled: set[str] = set()
        self._waiting_ids: set[str] = set()
        self.holding = False

    def watermark_us(self, source: TruthSource) -> int | None:
        """The stream's watermark; None before any truth."""
        mark = self._streams[source].watermark_us
        return None if mark == _NEVER else mark

    @property
    def pending(self) -> int:
        return len(self._waiting_ids)

    def remember(self, joined: PredictionJoined) -> bool:
        """One of the joiner's earlier settlements: never settled again, and
        its stream's watermark at least the one it was settled under. False
        for a repeat."""
        if joined.join_id in self._settled:
            return False
        self._settled.add(joined.join_id)
        stream = self._streams.get(joined.source)
        if stream is not None and joined.HasField("watermark"):
            stream.watermark_us = max(stream.watermark_us, joined.watermark.ToMicroseconds())
        return True

    def release(self) -> list[PredictionJoined]:
        """End ``holding``: each watermark moves on to where the truths read
        put it; returns what that expired."""
        self.holding = False
        settled = []
        for source, stream in self._streams.items():
            stream.release()
            settled.extend(self._expire(source, stream))
        return settled

    def prediction(self, prediction: PredictionLogged) -> list[PredictionJoined]:
        ident = join_id(prediction)
        if ident in self._settled or ident in self._waiting_ids:
            self._observe("prediction", "repeated")
            return []
        value = predicted(prediction)
        if value is None:
            self._observe("prediction", "unusable")
            return []
        key: Hashable
        if is_forecast(prediction):
            source, key, statistic, due_us = self._forecast_target(prediction)
        else:
            source, statistic = TRUTH_SOURCE_LABEL, ""
            key = (prediction.model_name, prediction.request_id)
            due_us = prediction.served_time.ToMicroseconds()
        waiting = _Waiting(prediction, ident, value[0], value[1], statistic, due_us)
        stream = self._streams[source]
        truth = stream.truths.get(key)
        if truth is not None:
            self._observe("prediction", "joined")
            return [self._settle(waiting, source, JOIN_OUTCOME_JOINED, truth[1])]
        if due_us < stream.watermark_us:
            self._observe("prediction", "expired")
            return [self._settle(waiting, source, JOIN_OUTCOME_EXPIRED, None)]
        self._observe("prediction", "waiting")
        stream.waiting.setdefault(key, []).append(waiting)
        heapq.heappush(stream.due_times, (due_us, key))
        self._waiting_ids.add(ident)
        return []

    def window(self, window: FeatureWindow, partition: int = 0) -> list[PredictionJoined]:
        if window.open:
            # A running aggregate: its closed window, same key, is the truth.
            self._observe("window", "open")
            return []
        start_us = window.window_start.ToMicroseconds()
        end_us = window.window_end.ToMicroseconds()
        key = window_key(
            window.entity_id, window.metric, dict(window.dimensions), end_us - start_us, start_us
        )
        return self._truth("window", TRUTH_SOURCE_WINDOW, key, end_us, window, partition)

    def label(self, label: Label, partition: int = 0) -> list[PredictionJoined]:
        key = (label.model_name, label.request_id)
        time_us = label.event_time.ToMicroseconds()
        return self._truth("label", TRUTH_SOURCE_LABEL, key, time_us, label, partition)

    def _truth(
        self,
        kind: str,
        source: TruthSource,
        key: Hashable,
        truth_us: int,
        truth: FeatureWindow | Label,
        partition: int,
    ) -> list[PredictionJoined]:
        stream = self._streams[source]
        late_before = stream.watermark_us
        if self.holding:
            # The held watermark cannot tell; its own partition's lateness can.
            own = stream.latest_us.get(partition, _NEVER)
            late_before = max(late_before, own - stream.lateness_us)
        if truth_us < late_before:
            self._observe(kind, "late")
            return []
        if key in stream.truths:
            # At-least-once upstream: the first of a window key or label counts.
            self._observe(kind, "repeated")
            return []
        self._observe(kind, "taken")
        stream.truths[key] = (truth_us, truth)
        heapq.heappush(stream.truth_times, (truth_us, key))
        settled = [
            self._settle(waiting, source, JOIN_OUTCOME_JOINED, truth)
            for waiting in stream.waiting.pop(key, [])
        ]
        stream.advance(truth_us, partition, holding=self.holding)
        if not self.holding:
            settled.extend(self._expire(source, stream))
        return settled

    def _expire(self, source: TruthSource, stream: _Stream) -> list[PredictionJoined]:
        """Predictions whose truth time the watermark passed, expired; truths
        it passed, let go."""
        settled = []
        while stream.due_times and stream.due_times[0][0] < stream.watermark_us:
            _, key = heapq.heappop(stream.due_times)
            for waiting in stream.waiting.pop(key, []):
                settled.append(self._settle(waiting, source, JOIN_OUTCOME_EXPIRED, None))
        while stream.truth_times and stream.truth_times[0][0] < stream.watermark_us:
            _, key = heapq.heappop(stream.truth_times)
            stream.truths.pop(key, None)
        return settled

    def _forecast_target(
        self, prediction: PredictionLogged
    ) -> tuple[TruthSource, WindowKey, str, int]:
        forecast = self._resolve(prediction.model_name, prediction.model_version)
        start_us = prediction.window_start.ToMicroseconds()
        size_us = prediction.window_end.ToMicroseconds() - start_us
        target_us = start_us + (forecast.slide_us or size_us)
        key = window_key(
            prediction.entity_id,
            prediction.window_metric,
            dict(prediction.window_dimensions),
            size_us,
            target_us,
        )
        return TRUTH_SOURCE_WINDOW, key, forecast.statistic, target_us + size_us

    def _settle(
        self,
        waiting: _Waiting,
        source: TruthSource,
        outcome: JoinOutcome,
        truth: FeatureWindow | Label | None,
    ) -> PredictionJoined:
        self._waiting_ids.discard(waiting.join_id)
        self._settled.add(waiting.join_id)
        p = waiting.prediction
        joined = PredictionJoined(
            join_id=waiting.join_id,
            request_id=p.request_id,
            model_name=p.model_name,
            model_version=p.model_version,
            role=p.role,
            served_time=p.served_time,
            source=source,
            outcome=outcome,
            metric=CLASS_ERROR if waiting.is_class else MAE,
            prediction=waiting.value,
            entity_id=p.entity_id,
            statistic=waiting.statistic,
            truth_time=timestamp(waiting.due_us),
        )
        watermark = self._streams[source].watermark_us
        if watermark != _NEVER:
            joined.watermark.CopyFrom(timestamp(watermark))
        if isinstance(truth, FeatureWindow):
            joined.truth = float(getattr(truth, waiting.statistic))
            joined.truth_window_key = truth.window_key
            joined.truth_window_start.CopyFrom(truth.window_start)
            joined.truth_window_end.CopyFrom(truth.window_end)
        elif isinstance(truth, Label):
            joined.truth = truth.value
            joined.truth_time.CopyFrom(truth.event_time)
        if truth is not None:
            joined.error = _error(waiting.value, joined.truth, waiting.is_class)
        return joined


def _error(value: float, truth: float, is_class: bool) -> float:
    if is_class:
        return 0.0 if round(truth) == value else 1.0
    return value - truth


def timestamp(micros: int) -> Timestamp:
    """A protobuf Timestamp of ``micros`` since the epoch."""
    stamp = Timestamp()
    stamp.FromMicroseconds(micros)
    return stamp
