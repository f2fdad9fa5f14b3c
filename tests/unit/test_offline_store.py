"""The offline store read back (``shared.offline_store``): a feature's
windows as a training distribution, what a model registered from outside is
watched against by svc_monitor; a model's training files as the windows and
clean events the lineage walk follows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shared.contracts.aistack.v1 import models_pb2
from shared.feature_store import WEB_LATENCY
from shared.offline_store import (
    OfflineStoreError,
    stored_windows,
    superseded,
    training_distribution,
)
from svc_monitor.watch import watched
from tests.unit.test_trainer_data import T0, TUMBLING, Window, series, write_store


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


def test_stored_windows_read_each_window_once_as_its_latest_batch_wrote_it(
    tmp_path: Path,
) -> None:
    windows = [
        Window("sensor-1", 0, 10.0, batch=0),
        Window("sensor-1", 1, 11.0, batch=0),
        # A later batch wrote window 1 again: that row is the one read.
        Window("sensor-1", 1, 11.5, batch=3),
        Window("host-1", 0, 5.0, metric=WEB_LATENCY, path="/api", unit="ms", batch=1),
    ]
    write_store(tmp_path, windows)
    files = sorted(str(path) for path in tmp_path.rglob("*.parquet"))
    stored = stored_windows(files)
    t0_us = int(T0.timestamp() * 1_000_000)
    rows = sorted(zip(stored.series, stored.start_us, stored.end_us, strict=True))
    assert rows == [
        (("host-1", WEB_LATENCY, "/api"), t0_us, t0_us + 60_000_000),
        (("sensor-1", "temperature", ""), t0_us, t0_us + 60_000_000),
        (("sensor-1", "temperature", ""), t0_us + 60_000_000, t0_us + 120_000_000),
    ]
    # Window i's clean events are offsets 100 i .. 100 i + 4 + i on partition 0:
    # merged over the windows read (not window 1's first batch again).
    assert stored.sources == [
        {
            "topic": "aistack.events.clean",
            "partition": 0,
            "min_offset": 0,
            "max_offset": 105,
            "count": 5 + 5 + 6,
        }
    ]


def test_files_written_before_windows_carried_sources_are_left_out(tmp_path: Path) -> None:
    write_store(tmp_path / "old", series("sensor-1", 3), sources=False)
    write_store(tmp_path / "new", series("sensor-2", 2))
    files = sorted(str(path) for path in tmp_path.rglob("*.parquet"))
    stored = stored_windows(files)
    assert {entity for entity, _, _ in stored.series} == {"sensor-2"}
    assert len(stored.start_us) == 2
    assert stored_windows([str(p) for p in (tmp_path / "old").rglob("*.parquet")]).series == []


def test_superseded_names_the_rows_a_later_batch_wrote_again(tmp_path: Path) -> None:
    write_store(
        tmp_path,
        [
            Window("a", 0, 1.0, batch=0),
            Window("a", 1, 2.0, batch=0),
            Window("b", 1, 2.0, batch=0),
            Window("a", 1, 3.0, batch=2),  # window a/1 again: row 1 of batch 0 is skipped
            Window("a", 2, 3.0, batch=3),  # a later window: overlaps nothing
        ],
    )
    files = sorted(str(path) for path in tmp_path.rglob("*.parquet"))
    first = next(path for path in files if "/batch=0/" in path)
    assert superseded(files) == {first: [1]}


def test_superseded_is_empty_when_batches_close_later_windows_or_for_other_parquet(
    tmp_path: Path,
) -> None:
    write_store(tmp_path / "store", series("sensor-1", 12))  # batches of 4 later windows each
    assert superseded(sorted(str(p) for p in (tmp_path / "store").rglob("*.parquet"))) == {}
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0]}), plain)
    assert superseded([str(plain)]) == {}
