"""The pure parts of svc_score's Spark job: the input's fingerprint, the
worker's error in one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd  # type: ignore[import-untyped]
import pytest

from shared import model_loading
from shared.contracts.aistack.v1 import models_pb2
from shared.errors import InvalidArgument
from svc_score import job
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


def test_only_local_files_are_fingerprinted() -> None:
    with pytest.raises(InvalidArgument, match="local files only"):
        job.input_digest(["s3://bucket/part.parquet"])


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
        monkeypatch.setitem(job._RUNNERS, (event.model_name, event.version, event.sha256), runner)
        return event

    return install


COLUMNS = ("a", "b", "c", "d")
TYPES = {column: "double" for column in COLUMNS}


def _frame_columns() -> list[pd.Series]:
    return [
        pd.Series([1.0, 10.0]),
        pd.Series([2.0, 20.0]),
        pd.Series([3.0, None]),
        pd.Series([4.0, 40.0]),
    ]


def test_one_output_is_one_column_of_the_models_values(
    summing_runner: Callable[..., models_pb2.ModelReady], tmp_path: Path
) -> None:
    event = summing_runner(("prediction", (-1, 1)))
    udf = job._predictor(plan(event, TYPES, COLUMNS), event.SerializeToString(), str(tmp_path))
    values = udf.func(*_frame_columns())
    assert values.dtype == np.float32
    assert values[0] == 10.0 and np.isnan(values[1])  # a null input reaches the model as NaN


def test_several_outputs_are_one_struct_computed_once(
    summing_runner: Callable[..., models_pb2.ModelReady], tmp_path: Path
) -> None:
    event = summing_runner(("prediction", (-1, 1)), ("pair", (-1, 2)))
    udf = job._predictor(plan(event, TYPES, COLUMNS), event.SerializeToString(), str(tmp_path))
    assert udf.returnType.simpleString() == "struct<prediction:float,pair:array<float>>"
    assert not udf.deterministic  # so Spark does not call it once per field
    frame = udf.func(*_frame_columns())
    assert list(frame.columns) == ["prediction", "pair"]
    assert frame["prediction"].tolist()[0] == 10.0
    assert [list(pair) for pair in frame["pair"]] == [[1.0, 1.0], [10.0, 10.0]]
