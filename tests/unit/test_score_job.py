"""The pure parts of svc_score's Spark job: the input's fingerprint, the
worker's error in one line, a batch scored in Arrow."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shared import model_loading
from shared.contracts.aistack.v1 import models_pb2
from svc_score import job, tasks
from svc_score.plan import plan
from tests.unit.test_score_plan import ready


def test_the_input_digest_changes_when_a_file_is_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "part.parquet"
    path.write_bytes(b"one")
    before = job.input_digest([str(path)])
    assert job.input_digest([f"file:{path}"]) == before  # as Hadoop lists it
    assert job.input_digest([path.as_uri()]) == before
    path.write_bytes(b"three")
    assert job.input_digest([str(path)]) != before


def test_an_objects_fingerprint_is_its_path_size_and_version_from_a_listing() -> None:
    import fsspec

    memory = fsspec.filesystem("memory")
    folder = f"/score-digest-{uuid.uuid4().hex}"
    memory.pipe_file(f"{folder}/a b.parquet", b"one")
    memory.pipe_file(f"{folder}/c.parquet", b"two")
    # As Hadoop lists them: the path escaped.
    urls = [f"memory://{folder}/a%20b.parquet", f"memory://{folder}/c.parquet"]
    before = job.input_digest(urls)
    assert job.input_digest(list(reversed(urls))) == before
    assert job.input_digest([f"memory://{folder}/a b.parquet", urls[1]]) == before
    memory.pipe_file(f"{folder}/c.parquet", b"three")
    assert job.input_digest(urls) != before


def test_a_failed_task_is_told_by_the_workers_last_line() -> None:
    text = (
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n"
        '  File "job.py", line 1, in run\n'
        "shared.model_loading.ArtifactRejected: artifact x has sha256 a, the event says b\n"
        "\n\nJVM stacktrace:\norg.apache.spark.api.python.PythonException: ...\n"
    )
    assert job._python_error(RuntimeError(text)) == (
        "shared.model_loading.ArtifactRejected: artifact x has sha256 a, the event says b"
    )


def _summing_model(x: np.ndarray) -> dict[str, np.ndarray]:
    rows = x.reshape(len(x), -1)
    return {"prediction": rows.sum(axis=1, keepdims=True), "pair": np.stack([rows[:, 0]] * 2, 1)}


@pytest.fixture
def summing_runner(monkeypatch: pytest.MonkeyPatch) -> Callable[..., models_pb2.ModelReady]:
    """A worker whose loaded model (for the event it returns) sums each row."""

    def install(*outputs: tuple[str, tuple[int, ...]]) -> models_pb2.ModelReady:
        event = ready("m", "1", shape=(-1, 2, 2), outputs=outputs)
        runner = model_loading.Runner(
            inputs=(model_loading.TensorSig("input", "FP32", (-1, 2, 2)),),
            outputs=(),
            run=lambda arrays: _summing_model(arrays["input"]),
            platform="test",
        )
        monkeypatch.setitem(tasks._RUNNERS, (event.model_name, event.version, event.sha256), runner)
        return event

    return install


COLUMNS = ("a", "b", "c", "d")
TYPES = {"entity_id": "string", **{column: "double" for column in COLUMNS}}


def _batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "entity_id": ["x", "y"],
            "a": [1.0, 10.0],
            "b": [2.0, 20.0],
            "c": [3.0, None],
            "d": [4.0, 40.0],
        }
    )


def _scored(event: models_pb2.ModelReady) -> pa.RecordBatch:
    chosen = plan(event, TYPES, COLUMNS)
    schema = tasks.output_schema(chosen, _batch().schema)
    runner = tasks._RUNNERS[(event.model_name, event.version, event.sha256)]
    return tasks.score_batch(runner, chosen, schema, _batch())


def test_one_output_is_one_column_of_the_models_values(
    summing_runner: Callable[..., models_pb2.ModelReady],
) -> None:
    event = summing_runner(("prediction", (-1, 1)))
    scored = _scored(event)
    assert scored.schema.names == ["entity_id", "prediction", "model_name", "model_version"]
    assert scored.schema.field("prediction").type == pa.float32()
    values = scored.column("prediction").to_pylist()
    assert values[0] == 10.0 and math.isnan(values[1])  # a null input reaches the model as NaN
    assert scored.column("entity_id").to_pylist() == ["x", "y"]
    assert scored.column("model_name").to_pylist() == ["m", "m"]
    assert scored.column("model_version").to_pylist() == ["1", "1"]


def test_several_outputs_are_columns_of_one_model_call(
    summing_runner: Callable[..., models_pb2.ModelReady],
) -> None:
    event = summing_runner(("prediction", (-1, 1)), ("pair", (-1, 2)))
    scored = _scored(event)
    assert scored.schema.field("pair").type == pa.list_(pa.float32())
    assert scored.column("prediction").to_pylist()[0] == 10.0
    assert scored.column("pair").to_pylist() == [[1.0, 1.0], [10.0, 10.0]]


def test_row_groups_are_shared_by_rows_each_share_in_input_order() -> None:
    units = [tasks.Unit(f"f{i}", 0, rows, {}) for i, rows in enumerate([50, 10, 40, 30, 20])]
    shares = tasks.share(units, 2)
    assert sorted(sum(u.rows for u in share) for share in shares) == [70, 80]
    for share in shares:
        assert share == sorted(share, key=units.index)
    assert sorted(u.path for share in shares for u in share) == [u.path for u in units]
    assert tasks.share(units[:1], 4) == [units[:1]]
    assert tasks.share([], 4) == []


def test_a_task_reads_its_row_groups_as_spark_hands_them_over(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    folder = tmp_path / "metric=temperature" / "batch=3"
    folder.mkdir(parents=True)
    start = pa.array([0, 60_000_000, 120_000_000], pa.timestamp("us"))
    pq.write_table(
        pa.table({"entity_id": ["a", "b", "c"], "mean": [1.0, None, 3.0], "start": start}),
        folder / "part-0.parquet",
        row_group_size=2,
        use_deprecated_int96_timestamps=True,  # as Spark writes them
    )
    units = tasks.units_of(str(tmp_path))
    assert [(u.row_group, u.rows) for u in units] == [(0, 2), (1, 1)]
    assert units[0].partition == {"metric": "temperature", "batch": 3}
    fed = pa.schema(
        [("entity_id", pa.string()), ("mean", pa.float64()), ("batch", pa.int32()),
         ("start", pa.timestamp("us", tz="UTC")), ("sources", pa.list_(pa.int64()))]
    )  # fmt: skip
    batches = list(tasks.read_units(units, fed, batch_rows=10))
    table = pa.Table.from_batches(batches)
    assert table.schema == fed
    assert table.column("entity_id").to_pylist() == ["a", "b", "c"]
    assert table.column("mean").to_pylist() == [1.0, None, 3.0]
    assert table.column("batch").to_pylist() == [3, 3, 3]  # the partition's value
    assert table.column("start").cast(pa.int64()).to_pylist() == start.cast(pa.int64()).to_pylist()
    assert table.column("sources").to_pylist() == [None, None, None]  # a column it lacks


def test_a_task_writes_its_file_and_reports_its_rows_and_their_sources_merged(
    summing_runner: Callable[..., models_pb2.ModelReady], tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    event = summing_runner(("prediction", (-1, 1)))
    source = pa.struct(
        [("topic", pa.string()), ("partition", pa.int32()), ("min_offset", pa.int64()),
         ("max_offset", pa.int64()), ("count", pa.int64())]
    )  # fmt: skip
    batch = pa.RecordBatch.from_pydict(
        {
            "entity_id": ["x", "x"],
            "window_key": ["k1", "k2"],
            **{column: [1.0, 2.0] for column in COLUMNS},
            "sources": pa.array(
                [[{"topic": "t", "partition": 0, "min_offset": 5, "max_offset": 9, "count": 3}],
                 [{"topic": "t", "partition": 0, "min_offset": 1, "max_offset": 4, "count": 2}]],
                pa.list_(source),
            ),
        }
    )  # fmt: skip
    types = {"entity_id": "string", "window_key": "string", **TYPES}
    chosen = plan(event, types, COLUMNS)
    task = tasks.Task.of(
        chosen,
        batch.schema,
        tasks.output_schema(chosen, batch.schema),
        "sources",
        cache_dir=str(tmp_path / "cache"),
        staging=str(tmp_path),
        run_id="run",
        batch_rows=10,
    )
    written = tasks.write_scored(task, "part-00000-run.parquet", [batch, batch.slice(0, 0)])
    assert written is not None
    assert (written.file, written.rows) == ("part-00000-run.parquet", 2)
    merged = {"topic": "t", "partition": 0, "min_offset": 1, "max_offset": 9, "count": 5}
    assert written.sources is not None and json.loads(written.sources) == [merged]
    parquet = pq.ParquetFile(tmp_path / written.file)
    assert parquet.schema_arrow.names == [
        "entity_id", "window_key", "prediction", "model_name", "model_version",
    ]  # fmt: skip
    chunks = parquet.metadata.row_group(0)
    encodings = {chunks.column(i).path_in_schema: chunks.column(i).encodings for i in range(5)}
    # Keys that repeat are dictionary-encoded; a window's key (a hash) is not.
    assert "RLE_DICTIONARY" in encodings["entity_id"]
    assert "RLE_DICTIONARY" not in encodings["window_key"]
    assert tasks.write_scored(task, "part-00001-run.parquet", []) is None
    assert not (tmp_path / "part-00001-run.parquet").exists()
