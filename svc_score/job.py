"""The Spark side of scoring: read the Parquet input, score it in vectorised
batches on the executors, write predictions and their lineage.

Each executor's Python worker fetches the artifact, checks its sha256 and
loads it once (``shared.model_loading``, the model server's own loader),
then reuses it for every batch of every task it runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import numpy as np
from google.protobuf import json_format

from shared import model_loading
from shared.contracts.aistack.v1 import models_pb2
from shared.errors import AistackError, InvalidArgument
from shared.feature_store import merge_source_column
from shared.log import get_logger
from svc_score.plan import BadInput, Plan, plan
from svc_score.publish import Layout, Publication, publish

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = get_logger("svc_score")

#: The file beside the output's Parquet files that says where they came from.
LINEAGE_FILE = "_lineage.json"
#: Under the cache directory: the executors' copies of artifacts.
EXECUTORS = "executors"

# The struct column of a model's several outputs, before it is expanded.
_SCORED = "__aistack_scored"

#: numpy types of the output columns' Spark types (``Plan.outputs``).
_NUMPY_OUTPUT_TYPES = {
    "float": np.float32,
    "double": np.float64,
    "tinyint": np.int8,
    "smallint": np.int16,
    "int": np.int32,
    "bigint": np.int64,
    "boolean": np.bool_,
}

# This Python worker's loaded models, by (name, version, sha256): loaded on
# the first batch a worker scores, reused by every later one.
_RUNNERS: dict[tuple[str, str, str], model_loading.Runner] = {}


@dataclass(frozen=True)
class Scored:
    output: Path
    rows: int
    lineage: dict[str, Any]


def score(
    spark: SparkSession,
    event: models_pb2.ModelReady,
    *,
    input_path: str,
    output: Path,
    cache_dir: Path,
    columns: tuple[str, ...] = (),
    where: str = "",
    publish_to: Publication | None = None,
) -> Scored:
    """Score every row of the Parquet at ``input_path`` with ``event``'s
    model into a new directory ``output``: Parquet files and ``LINEAGE_FILE``;
    only the rows that match ``where`` (a Spark SQL condition) when given;
    with ``publish_to``, each output row to that topic too (``publish``).

    The output appears whole or not at all: Spark writes beside it, and the
    directory is renamed into place once the job (and the publishing) has
    succeeded. Raises
    InvalidArgument (the output exists, the input is not Parquet), BadInput
    (see ``plan``), ArtifactRejected (a tampered or unloadable artifact, on
    the driver before any row is read)."""
    from pyspark.sql import functions

    if output.exists():
        raise InvalidArgument(f"{output} exists; scoring writes a new directory")
    # The driver verifies first: a tampered artifact stops here, before a task runs.
    verified = model_loading.fetch(event, cache_dir / "driver")
    # No leading dot: Hadoop skips hidden paths, and the row count reads it back.
    staging = output.with_name(f"{output.name}.{uuid.uuid4().hex}.partial")
    try:
        try:
            frame = spark.read.parquet(input_path)
        except Exception as exc:  # AnalysisException: no such path, not Parquet
            raise InvalidArgument(
                f"{input_path}: cannot read it as Parquet: {_first_line(exc)}"
            ) from exc
        if where:
            frame = _filtered(frame, where)
        types = {field.name: field.dataType.simpleString() for field in frame.schema.fields}
        chosen = plan(event, types, columns)
        files = sorted(frame.inputFiles())
        predict = _predictor(chosen, event.SerializeToString(), str(cache_dir / EXECUTORS))
        predicted = predict(*chosen.columns)
        model = [
            functions.lit(event.model_name).alias("model_name"),
            functions.lit(event.version).alias("model_version"),
        ]
        if len(chosen.outputs) == 1:
            scored = frame.select(*chosen.keys, predicted.alias(chosen.outputs[0][0]), *model)
        else:
            scored = frame.select(*chosen.keys, predicted.alias(_SCORED)).select(
                *chosen.keys, f"{_SCORED}.*", *model
            )
        try:
            scored.write.parquet(str(staging))
        except Exception as exc:  # a task failed: Spark wraps the worker's error
            raise JobFailed(f"the Spark job failed: {_python_error(exc)}") from exc
        rows = _rows(spark, staging)
        run_id = uuid.uuid4().hex
        lineage: dict[str, Any] = {
            "run_id": run_id,
            "model": event.model_name,
            "version": event.version,
            "artifact_sha256": event.sha256,
            "artifact_uri": event.artifact_uri,
            "input": input_path,
            "input_files": len(files),
            "input_digest": input_digest(files),
            "input_digest_of": "sha256 over each input file's path, size and mtime",
            "columns": list(chosen.columns),
            "where": where,
            "rows": rows,
            # How the model came to be: study, trial, parameters, training files.
            "model_lineage": json_format.MessageToDict(event.lineage),
            "files": files_lineage(staging),
        }
        if publish_to is not None:
            layout = Layout.of(chosen, types)
            try:
                published = publish(spark, staging, layout, run_id, publish_to)
            except Exception as exc:  # a task could not deliver its records
                raise JobFailed(
                    f"publishing to {publish_to.topic} failed: {_python_error(exc)}"
                ) from exc
            lineage["published"] = {"topic": publish_to.topic, "records": published}
        (staging / LINEAGE_FILE).write_text(json.dumps(lineage, indent=2) + "\n")
        os.replace(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(verified, ignore_errors=True)
    log.info("score.written", model=event.model_name, version=event.version, rows=rows)
    return Scored(output, rows, lineage)


class JobFailed(AistackError):
    """A task of the job failed (on an executor: a worker's artifact copy
    refused, a framework error); the message is the worker's last line."""

    reason = "job_failed"


def _filtered(frame: Any, where: str) -> Any:
    try:
        filtered = frame.where(where)
        filtered.schema  # noqa: B018 - analysing the plan raises for a bad condition
    except Exception as exc:  # ParseException, AnalysisException
        raise BadInput(f"--where {where!r}: {_first_line(exc)}") from exc
    return filtered


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _python_error(exc: BaseException) -> str:
    # A PythonException's text is the worker's traceback, then the JVM's:
    # the worker's last line names the error.
    text = str(exc).split("JVM stacktrace:")[0]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _rows(spark: SparkSession, path: Path) -> int:
    # Parquet footers hold the row counts: this reads no data.
    return int(spark.read.parquet(str(path)).count())


def files_lineage(output: Path) -> dict[str, dict[str, Any]]:
    """Per Parquet file of ``output``: its rows and, where the rows carry
    their windows' ``sources``, the clean-event offsets under them, merged
    per partition (min, max, count)."""
    import pyarrow.parquet as pq

    lineage: dict[str, dict[str, Any]] = {}
    for path in sorted(output.glob("*.parquet")):
        names = pq.read_schema(path).names
        entry: dict[str, Any] = {"rows": pq.read_metadata(path).num_rows}
        if "sources" in names:
            entry["sources"] = merge_source_column(pq.read_table(path, columns=["sources"])[0])
        lineage[path.name] = entry
    return lineage


def input_digest(files: list[str]) -> str:
    """sha256 over each local file's absolute path, size and modification
    time (not its bytes: a cheap fingerprint that changes when a file is
    rewritten). ``files`` are paths or ``file:`` URIs, as Spark lists them."""
    sha = hashlib.sha256()
    for path in sorted(_local(name) for name in files):
        stat = path.stat()
        sha.update(f"{path}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return sha.hexdigest()


def _local(name: str) -> Path:
    # Hadoop writes local files as file:/path, with one slash.
    if name.startswith("file:"):
        return Path(unquote(urlparse(name).path)).resolve()
    if "://" in name:
        raise InvalidArgument(f"{name}: batch scoring reads local files only")
    return Path(name).resolve()


def _predictor(chosen: Plan, event_bytes: bytes, cache_dir: str) -> Any:
    """A scalar pandas UDF over the input columns: the model's outputs for
    each row, one column for one output, else a struct of them. The keys
    never leave the JVM. It captures only plain values: the model is loaded
    where it runs."""
    import pandas as pd  # type: ignore[import-untyped]  # no stubs; pyspark's own dependency
    from pyspark.sql import types as T
    from pyspark.sql.pandas import functions as pandas_functions

    row_shape = chosen.row_shape
    outputs = chosen.outputs
    # DataType objects, not DDL: parsing DDL needs a running session.
    atomic = {
        "float": T.FloatType(),
        "double": T.DoubleType(),
        "tinyint": T.ByteType(),
        "smallint": T.ShortType(),
        "int": T.IntegerType(),
        "bigint": T.LongType(),
        "boolean": T.BooleanType(),
    }
    types = [
        atomic[spark_type] if scalar else T.ArrayType(atomic[spark_type])
        for _, spark_type, scalar in outputs
    ]
    single = len(outputs) == 1

    def predict(*columns: Any) -> Any:
        runner = _runner(event_bytes, cache_dir)
        (signature,) = runner.inputs
        dtype = model_loading.NUMPY_TYPES[signature.datatype]
        rows = len(columns[0])
        x = np.empty((rows, len(columns)), dtype=dtype)
        for i, column in enumerate(columns):
            x[:, i] = column.to_numpy(dtype=dtype, na_value=np.nan)
        predicted = runner.run({signature.name: x.reshape((rows, *row_shape))})
        result = {}
        for output, spark_type, scalar in outputs:
            values: np.ndarray[Any, Any] = np.asarray(
                predicted[output], dtype=_NUMPY_OUTPUT_TYPES[spark_type]
            ).reshape(rows, -1)
            result[output] = pd.Series(values[:, 0] if scalar else list(values))
        return result[outputs[0][0]] if single else pd.DataFrame(result)

    # pyspark's stubs type pandas_udf by the function's annotations, which
    # are set below; at run time it reads them, as objects.
    pandas_udf: Any = pandas_functions.pandas_udf
    predict.__annotations__ = {"columns": pd.Series, "return": pd.Series}
    if single:
        return pandas_udf(predict, types[0])
    names = [name for name, _, _ in outputs]
    struct = T.StructType([T.StructField(n, t) for n, t in zip(names, types, strict=True)])
    predict.__annotations__["return"] = pd.DataFrame
    # Not collapsed into the projection that expands the struct, which
    # would call the model once per output.
    return pandas_udf(predict, struct).asNondeterministic()


def _runner(event_bytes: bytes, cache_dir: str) -> model_loading.Runner:
    event = models_pb2.ModelReady.FromString(event_bytes)
    key = (event.model_name, event.version, event.sha256)
    runner = _RUNNERS.get(key)
    if runner is None:
        # A directory of this worker's own: the workers of one machine fetch
        # at the same time, and each verifies the copy it loads.
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        own = Path(tempfile.mkdtemp(prefix=f"worker-{os.getpid()}-", dir=cache_dir))
        directory = model_loading.fetch(event, own)
        # One thread per task: Spark runs as many tasks as it has cores.
        runner = model_loading.load(event, directory, intra_op_threads=1)
        _RUNNERS[key] = runner
    return runner
