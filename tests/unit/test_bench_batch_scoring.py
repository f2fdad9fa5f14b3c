"""bench.batch_scoring's pure parts: the offline store it generates and the
single-process peer's output, which must be the Spark job's."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from bench import batch_scoring as bench
from shared.contracts.aistack.v1 import models_pb2
from shared.feature_store import FEATURE_STATS, OFFLINE_COLUMNS, PARTITION_COLUMNS, partition_path
from shared.model_loading import Runner, TensorSig
from svc_score.plan import KEY_COLUMNS, MODEL_COLUMNS, plan


def forecaster_event() -> models_pb2.ModelReady:
    return models_pb2.ModelReady(
        model_name="forecaster",
        version="3",
        inputs=[
            models_pb2.TensorSpec(name="input", datatype="FP32", shape=[-1, len(FEATURE_STATS)])
        ],
        outputs=[models_pb2.TensorSpec(name="prediction", datatype="FP32", shape=[-1, 1])],
    )


def summing_runner() -> Runner:
    """A model whose prediction is the sum of its row: checkable by hand."""

    def run(arrays: Any) -> dict[str, Any]:
        return {"prediction": arrays["input"].sum(axis=1, keepdims=True)}

    return Runner(
        inputs=(TensorSig("input", "FP32", (-1, len(FEATURE_STATS))),),
        outputs=(TensorSig("prediction", "FP32", (-1, 1)),),
        run=run,
        platform="test",
    )


@pytest.mark.parametrize(("rows", "parts"), [(10, 3), (8, 8), (1_000_001, 8)])
def test_split_rows_covers_every_row_in_even_parts(rows: int, parts: int) -> None:
    sizes = bench.split_rows(rows, parts)
    assert len(sizes) == parts
    assert sum(sizes) == rows
    assert max(sizes) - min(sizes) <= 1


def test_split_rows_refuses_empty_files() -> None:
    with pytest.raises(ValueError, match="3 rows into 4"):
        bench.split_rows(3, 4)


def test_the_store_has_the_offline_layout_and_feeds_the_plan(tmp_path: Path) -> None:
    assert bench.write_store(tmp_path, 50, files=4) == 50
    files = sorted(tmp_path.rglob("*.parquet"))
    assert len(files) == 4
    for day, file in enumerate(files):
        assert file.parent.relative_to(tmp_path).as_posix() == partition_path(
            date=f"2025-01-0{day + 1}", metric=bench.METRIC, window=bench.WINDOW, batch=day
        )
        assert tuple(pq.read_schema(file).names) == OFFLINE_COLUMNS
    dataset = ds.dataset(tmp_path, format="parquet", partitioning="hive")
    assert dataset.count_rows() == 50
    assert tuple(dataset.schema.names) == (*OFFLINE_COLUMNS, *PARTITION_COLUMNS)
    chosen = plan(forecaster_event(), bench.spark_types(dataset.schema))
    assert chosen.columns == FEATURE_STATS
    assert chosen.keys == KEY_COLUMNS


def test_the_store_names_each_windows_clean_events_as_svc_transform_does() -> None:
    table = bench.offline_table(3_000, day=1, seed=5)
    windows = table.select(["entity_id", "count", "sources"]).to_pylist()
    by_partition: dict[int, list[tuple[int, int]]] = {}
    entity_partition: dict[str, int] = {}
    for window in windows:
        [source] = window["sources"]  # one partition: the topic is keyed by entity
        assert source["topic"] == "aistack.events.clean"
        assert source["count"] == window["count"]
        assert source["max_offset"] - source["min_offset"] + 1 == source["count"]
        partition = entity_partition.setdefault(window["entity_id"], source["partition"])
        assert source["partition"] == partition
        by_partition.setdefault(partition, []).append((source["min_offset"], source["max_offset"]))
    assert set(by_partition) == set(range(bench.CLEAN_PARTITIONS))
    for spans in by_partition.values():
        # Each partition's offsets run on from window to window, none twice.
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(spans))


def test_the_store_is_seeded(tmp_path: Path) -> None:
    first = bench.offline_table(30, day=2, seed=5)
    assert first.equals(bench.offline_table(30, day=2, seed=5))
    assert not first.equals(bench.offline_table(30, day=2, seed=6))


def test_the_peer_writes_the_spark_jobs_columns_for_every_row(tmp_path: Path) -> None:
    bench.write_store(tmp_path / "store", 45, files=3)
    event = forecaster_event()

    written = bench.score_arrow(
        summing_runner(), event, tmp_path / "store", tmp_path / "out", batch=7
    )

    source = ds.dataset(tmp_path / "store", format="parquet", partitioning="hive").to_table()
    scored = ds.dataset(tmp_path / "out", format="parquet").to_table()
    assert written == scored.num_rows == 45
    assert len(list((tmp_path / "out").iterdir())) == 3
    assert scored.column_names == [*KEY_COLUMNS, "prediction", *MODEL_COLUMNS]
    assert scored.column("window_key").to_pylist() == source.column("window_key").to_pylist()
    expected = np.column_stack([source.column(s).to_numpy() for s in FEATURE_STATS]).astype(
        np.float32
    )
    np.testing.assert_allclose(
        scored.column("prediction").to_numpy(), expected.sum(axis=1), rtol=1e-6
    )
    assert set(scored.column("model_name").to_pylist()) == {"forecaster"}
    assert set(scored.column("model_version").to_pylist()) == {"3"}
    assert bench.prediction_sum(tmp_path / "out") == pytest.approx(
        float(expected.sum(axis=1).sum()), rel=1e-6
    )


def test_a_figure_is_its_median_run() -> None:
    figure = bench.Figure(
        "x", (bench.Run(1000, 4.0, 1.0), bench.Run(1000, 1.0, 1.0), bench.Run(1000, 2.0, 1.0))
    )
    assert figure.seconds == 2.0
    assert figure.rows_per_second == 500.0
    assert "1,000 rows in 2.00 s" in figure.line()
    assert "= 500 rows/s" in figure.line()


def test_contenders_must_agree_on_the_predictions() -> None:
    bench.check_same_predictions(
        {"a": [bench.Run(5, 1.0, 100.0)], "b": [bench.Run(5, 1.0, 100.0000001)]}
    )
    with pytest.raises(RuntimeError, match="b's predictions"):
        bench.check_same_predictions(
            {"a": [bench.Run(5, 1.0, 100.0)], "b": [bench.Run(5, 1.0, 101.0)]}
        )
