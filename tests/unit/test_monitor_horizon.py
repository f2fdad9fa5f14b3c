"""The sliding horizon: the latest windows of a feature by start, each once,
with where it was read."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shared.contracts.aistack.v1.features_pb2 import FeatureWindow
from shared.feature_store import window_fields
from svc_monitor.horizon import Horizon, Horizons, Outcome, Position, entry_of

T0_US = 1_700_000_000_000_000
MINUTE_US = 60_000_000


def window(
    minute: int,
    *,
    entity: str = "sensor-1",
    metric: str = "temperature",
    mean: float = 20.0,
    size: int = 60,
    slide: int = 60,
    path: str = "",
) -> FeatureWindow:
    message = FeatureWindow(
        window_key=f"{entity}/{metric}/{path}/{size}/{slide}/{minute}",
        entity_id=entity,
        metric=metric,
        mean=mean,
        stddev=2.0,
        count=60,
    )
    if path:
        message.dimensions["path"] = path
    message.window_start.FromMicroseconds(T0_US + minute * MINUTE_US)
    message.window_size.FromSeconds(size)
    message.window_slide.FromSeconds(slide)
    return message


def test_a_window_belongs_to_its_kinds_field_and_its_paths() -> None:
    assert window_fields(window(0)) == ["temperature@tumbling-60s"]
    assert window_fields(window(0, size=300, slide=60)) == ["temperature@sliding-300s-every-60s"]
    assert window_fields(window(0, metric="http.latency_ms", path="/api/orders")) == [
        "http.latency_ms@tumbling-60s",
        "http.latency_ms|path=/api/orders@tumbling-60s",
    ]


def test_an_entry_keeps_statistics_start_and_position() -> None:
    entry = entry_of(window(3, mean=21.5), Position(2, 41))
    assert entry.start_us == T0_US + 3 * MINUTE_US
    assert entry.position == Position(2, 41)
    assert entry.statistics["mean"] == 21.5 and entry.statistics["count"] == 60.0


def test_repeats_are_dropped_by_window_key() -> None:
    horizon = Horizon(5)
    assert horizon.add(entry_of(window(0), Position(0, 0))) is Outcome.NEW
    # The sink delivered it again, further on in the partition.
    assert horizon.add(entry_of(window(0), Position(0, 9))) is Outcome.REPEATED
    assert len(horizon) == 1
    assert [e.position for e in horizon] == [Position(0, 0)]


def test_the_oldest_windows_go_first_whatever_the_arrival_order() -> None:
    minutes = list(range(8))
    orders = [minutes, minutes[::-1], [3, 7, 0, 5, 1, 6, 2, 4]]
    kept = []
    for order in orders:
        horizon = Horizon(4)
        for offset, minute in enumerate(order):
            horizon.add(entry_of(window(minute), Position(minute % 2, offset)))
        kept.append([e.start_us for e in horizon])
    assert kept[0] == [T0_US + m * MINUTE_US for m in (4, 5, 6, 7)]
    assert kept[1] == kept[0] and kept[2] == kept[0]


def test_a_window_older_than_a_full_horizon_is_late_and_an_evicted_repeat_too() -> None:
    horizon = Horizon(3)
    for minute in range(5):
        horizon.add(entry_of(window(minute), Position(0, minute)))
    assert horizon.first_start_us == T0_US + 2 * MINUTE_US
    assert horizon.last_start_us == T0_US + 4 * MINUTE_US
    assert horizon.add(entry_of(window(1), Position(0, 10))) is Outcome.LATE
    # Minute 0 was let go; its repeat must not come back in.
    assert horizon.add(entry_of(window(0), Position(0, 11))) is Outcome.LATE
    assert [e.position.offset for e in horizon] == [2, 3, 4]
    # Not full: an old window still has room.
    roomy = Horizon(3)
    roomy.add(entry_of(window(5), Position(0, 0)))
    assert roomy.add(entry_of(window(1), Position(0, 1))) is Outcome.NEW


def test_values_are_the_horizons_statistics() -> None:
    horizon = Horizon(10)
    for minute, mean in zip(range(4), (1.0, 2.0, 3.0, 4.0), strict=True):
        horizon.add(entry_of(window(minute, mean=mean), Position(0, minute)))
    values = horizon.values(["mean", "count", "not-a-statistic"])
    assert set(values) == {"mean", "count"}
    np.testing.assert_array_equal(values["mean"], [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError):
        Horizon(0)


def test_horizons_keep_one_per_feature_and_say_where_a_window_was_new() -> None:
    horizons = Horizons(2)
    offsets = itertools.count()
    web = window(0, metric="http.latency_ms", path="/a")
    assert horizons.add(web, Position(0, next(offsets))) == {
        "http.latency_ms@tumbling-60s": Outcome.NEW,
        "http.latency_ms|path=/a@tumbling-60s": Outcome.NEW,
    }
    other = window(0, metric="http.latency_ms", path="/b")
    outcomes = horizons.add(other, Position(1, next(offsets)))
    assert outcomes["http.latency_ms@tumbling-60s"] is Outcome.NEW
    all_paths = horizons.get("http.latency_ms@tumbling-60s")
    one_path = horizons.get("http.latency_ms|path=/a@tumbling-60s")
    assert all_paths is not None and len(all_paths) == 2
    assert one_path is not None and len(one_path) == 1
    assert horizons.get("temperature@tumbling-60s") is None
    assert horizons.features() == [
        "http.latency_ms@tumbling-60s",
        "http.latency_ms|path=/a@tumbling-60s",
        "http.latency_ms|path=/b@tumbling-60s",
    ]
