"""The offline store read back (``shared.offline_store``): a feature's
windows as a training distribution, what a model registered from outside is
watched against by svc_monitor."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.contracts.aistack.v1 import models_pb2
from shared.offline_store import OfflineStoreError, training_distribution
from svc_monitor.watch import watched
from tests.unit.test_trainer_data import T0, TUMBLING, series, write_store


def test_a_features_windows_are_its_training_distribution_and_the_monitor_watches_it(
    tmp_path: Path,
) -> None:
    write_store(tmp_path, series("sensor-1", 12) + series("sensor-2", 12))
    reference = training_distribution(tmp_path, f"temperature@{TUMBLING}")
    assert reference.feature == f"temperature@{TUMBLING}" and reference.window == TUMBLING
    by_name = {s.statistic: s for s in reference.statistics}
    assert by_name["mean"].windows == 24
    assert by_name["mean"].quantiles[0] == 10.0 and by_name["mean"].quantiles[-1] == 21.0
    assert reference.first_window_start.ToDatetime().replace(tzinfo=T0.tzinfo) == T0
    event = models_pb2.ModelReady(model_name="outside", version="1")
    event.training_distribution.CopyFrom(reference)
    watch = watched(event)
    assert watch is not None and watch.feature == reference.feature
    assert set(watch.references) >= {"mean", "count"}


def test_bounds_keep_the_windows_starting_within_them(tmp_path: Path) -> None:
    write_store(tmp_path, series("sensor-1", 12))
    first_us = int(T0.timestamp() * 1_000_000)
    bounded = training_distribution(
        tmp_path, f"temperature@{TUMBLING}", (first_us + 60_000_000, first_us + 180_000_000)
    )
    assert {s.statistic: s.windows for s in bounded.statistics}["mean"] == 3


@pytest.mark.parametrize(
    ("feature", "said"),
    [
        ("temperature", "expected metric@window"),
        ("humidity@tumbling-60s", "no metric 'humidity'"),
        ("temperature@sliding-300s-every-60s", "no window"),
    ],
)
def test_a_feature_the_store_does_not_hold_is_named(
    tmp_path: Path, feature: str, said: str
) -> None:
    write_store(tmp_path, series("sensor-1", 4))
    with pytest.raises(OfflineStoreError, match=said):
        training_distribution(tmp_path, feature)
