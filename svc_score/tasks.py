"""What a scoring job's tasks run, in their Python workers: Arrow batches in,
scored, written to the task's own Parquet file with pyarrow; the driver gets
back only each file's name, rows and the clean-event offsets under its rows.

Two ways the batches come:

- ``from_files``: the task reads its share of the input's row groups itself
  (pyarrow, in C++), so no input row goes through the JVM at all. The job
  takes it when every input row is scored.
- ``from_spark``: Spark reads and filters the input (a ``--where``
  condition is Spark SQL) and hands the task its rows as Arrow batches
  (``mapInArrow``).

The input and the staging directory are each a local path or a URL
(``s3://…`` on the object store): a URL is read and written through
``svc_score.output.arrow_filesystem`` with the store's settings the ``Task``
carries, never through the worker's environment.

A task's functions capture only plain values (``Task``; protobuf messages
do not pickle): the plan is built again, and the model loaded, where it
runs. Each Python worker loads a model once (``shared.model_loading``, the
model server's own loader) and reuses it for every later batch and task.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from shared import model_loading
from shared.contracts.aistack.v1 import models_pb2
from shared.feature_store import merge_source_column
from shared.settings import ObjectStoreSettings
from svc_score import output
from svc_score.plan import MODEL_COLUMNS, ROW_SOURCES, Plan

if TYPE_CHECKING:
    import pyarrow as pa

#: What each task tells the driver of the file it wrote (``from_spark``'s
#: Spark schema; ``from_files`` yields the same as tuples).
WRITTEN_SCHEMA = "file string, rows long, sources string"

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

#: Key columns left out of Parquet's dictionary encoding (``dictionary_columns``;
#: the model's outputs, continuous numbers, are never in it): a window's key
#: is a hash, one value a row, and a row's sources a nested list. Building a
#: dictionary of a million distinct keys only to drop it cost a quarter of a
#: file's write (0.35 s against 0.26 s for a million scored windows).
_NOT_DICTIONARY = frozenset({"window_key", ROW_SOURCES})

# This Python worker's loaded models, by (name, version, sha256): loaded on
# the first batch a worker scores, reused by every later one.
_RUNNERS: dict[tuple[str, str, str], model_loading.Runner] = {}


class Written(NamedTuple):
    """One task's file: its name in the output, rows, and the merged
    ``sources`` of its rows as JSON (None when the input has none)."""

    file: str
    rows: int
    sources: str | None


class Unit(NamedTuple):
    """A row group of an input file (a path, or a URL of the input's
    scheme), with the file's Hive partition values."""

    path: str
    row_group: int
    rows: int
    partition: Mapping[str, Any]


@dataclass(frozen=True)
class Task:
    """Everything a task needs, as plain values."""

    event_bytes: bytes
    columns: tuple[str, ...]
    row_shape: tuple[int, ...]
    keys: tuple[str, ...]
    outputs: tuple[tuple[str, str, bool], ...]
    cache_dir: str  # where each worker keeps its verified copy of the artifact
    staging: str  # the output directory being written: a path, or a URL
    run_id: str
    fed_schema: bytes  # the Arrow schema of the columns fed (keys, inputs, sources)
    output_schema: bytes  # the Arrow schema of the files written
    merge: str  # the input's sources column; "" when it has none
    batch_rows: int  # rows per model call
    # Per input file, the rows not to score: an offline-store window a later
    # batch wrote again (``shared.offline_store.superseded``).
    skip: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # How the workers reach the input, the staging prefix and an artifact
    # on the object store (a frozen settings object pickles; its secret stays
    # a SecretStr).
    object_store: ObjectStoreSettings = dataclasses.field(default_factory=ObjectStoreSettings)

    @classmethod
    def of(cls, chosen: Plan, fed: pa.Schema, output: pa.Schema, merge: str, **run: Any) -> Task:
        """The task of ``chosen``; ``run``: the other fields (``cache_dir``,
        ``staging``, ``run_id``, ``batch_rows``, ``object_store``)."""
        return cls(
            event_bytes=chosen.event.SerializeToString(),
            columns=chosen.columns,
            row_shape=chosen.row_shape,
            keys=chosen.keys,
            outputs=chosen.outputs,
            fed_schema=fed.serialize().to_pybytes(),
            output_schema=output.serialize().to_pybytes(),
            merge=merge,
            **run,
        )


def output_schema(chosen: Plan, fed: pa.Schema) -> pa.Schema:
    """The output files' Arrow schema: ``chosen.keys`` as ``fed`` (the
    Arrow schema of the columns fed) has them, then the model's outputs (a
    list per row where an output has several values), then the model's
    name and version."""
    import pyarrow as pa

    fields = [fed.field(key) for key in chosen.keys]
    for name, spark_type, scalar in chosen.outputs:
        value = pa.from_numpy_dtype(_NUMPY_OUTPUT_TYPES[spark_type])
        fields.append(pa.field(name, value if scalar else pa.list_(value)))
    fields += [pa.field(column, pa.string()) for column in MODEL_COLUMNS]
    return pa.schema(fields)


def score_batch(
    runner: model_loading.Runner, chosen: Plan, schema: pa.Schema, batch: pa.RecordBatch
) -> pa.RecordBatch:
    """``batch`` (the keys and input columns) scored: ``schema``'s columns.
    A null input reaches the model as NaN."""
    import pyarrow as pa

    (signature,) = runner.inputs
    dtype = model_loading.NUMPY_TYPES[signature.datatype]
    rows = batch.num_rows
    x = np.empty((rows, len(chosen.columns)), dtype=dtype)
    for i, column in enumerate(chosen.columns):
        x[:, i] = batch.column(column).to_numpy(zero_copy_only=False)
    predicted = runner.run({signature.name: x.reshape((rows, *chosen.row_shape))})
    arrays = [batch.column(key) for key in chosen.keys]
    for name, spark_type, scalar in chosen.outputs:
        values: np.ndarray[Any, Any] = np.asarray(
            predicted[name], dtype=_NUMPY_OUTPUT_TYPES[spark_type]
        ).reshape(rows, -1)
        if scalar:
            arrays.append(pa.array(values[:, 0]))
        else:
            offsets = np.arange(0, values.size + 1, values.shape[1], dtype=np.int32)
            arrays.append(pa.ListArray.from_arrays(offsets, values.reshape(-1)))
    arrays += [pa.repeat(chosen.event.model_name, rows), pa.repeat(chosen.event.version, rows)]
    return pa.RecordBatch.from_arrays(
        [a.cast(field.type) for a, field in zip(arrays, schema, strict=True)], schema=schema
    )


def write_scored(task: Task, name: str, batches: Iterable[pa.RecordBatch]) -> Written | None:
    """Score ``batches`` into the file ``name`` of the staging directory or
    prefix (a retried task writes the same name again, a whole object on the
    store); None, and no file, for no rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.ipc.read_schema(pa.py_buffer(task.output_schema))
    event = models_pb2.ModelReady.FromString(task.event_bytes)
    here = Plan(event, task.columns, task.row_shape, task.keys, task.outputs)
    runner = _runner(task.event_bytes, task.cache_dir, task.object_store)
    filesystem, path = output.arrow_filesystem(output.join(task.staging, name), task.object_store)
    writer: pq.ParquetWriter | None = None
    rows = 0
    sources: list[pa.Array] = []
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None:
                writer = pq.ParquetWriter(
                    path,
                    schema,
                    filesystem=filesystem,
                    use_dictionary=dictionary_columns(task.keys),
                )
            writer.write_batch(score_batch(runner, here, schema, batch))
            rows += batch.num_rows
            if task.merge:
                sources.append(batch.column(task.merge))
    finally:
        if writer is not None:
            writer.close()
    if not rows:
        return None
    merged = json.dumps(merge_source_column(pa.chunked_array(sources))) if task.merge else None
    return Written(name, rows, merged)


def dictionary_columns(keys: Sequence[str]) -> list[str]:
    """The output's columns Parquet dictionary-encodes: the keys that repeat
    (an entity's id, a window's bounds) and the model's name and version."""
    return [key for key in keys if key not in _NOT_DICTIONARY] + list(MODEL_COLUMNS)


def file_name(task: Task, index: int) -> str:
    return f"part-{index:05d}-{task.run_id}.parquet"


def from_spark(task: Task) -> Any:
    """``mapInArrow``'s function: the task's batches as Spark read them."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        written = write_scored(
            task, file_name(task, context.partitionId() if context else 0), batches
        )
        if written is not None:
            yield pa.RecordBatch.from_pydict(
                {
                    "file": pa.array([written.file]),
                    "rows": pa.array([written.rows], pa.int64()),
                    "sources": pa.array([written.sources], pa.string()),
                }
            )

    return run


def from_files(task: Task) -> Any:
    """``mapPartitionsWithIndex``'s function over ``Unit``s: the task reads
    its row groups itself."""

    def run(index: int, units: Iterator[Unit]) -> Iterator[Written]:
        import pyarrow as pa

        fed = pa.ipc.read_schema(pa.py_buffer(task.fed_schema))
        batches = read_units(list(units), fed, task.batch_rows, dict(task.skip), task.object_store)
        written = write_scored(task, file_name(task, index), batches)
        if written is not None:
            yield written

    return run


def units_of(input_path: str, settings: ObjectStoreSettings | None = None) -> list[Unit]:
    """Every row group of the Parquet files under ``input_path`` (a file or
    a directory of Hive partitions ``key=value``; a URL's on the store
    ``settings`` describes, default the environment's), as Spark lists them
    (files whose name starts with ``_`` or ``.`` are not data). A URL's
    units name their files by URLs of its scheme."""
    import pyarrow.dataset as ds

    filesystem, path = output.arrow_filesystem(input_path, settings or ObjectStoreSettings())
    dataset = ds.dataset(path, format="parquet", partitioning="hive", filesystem=filesystem)
    units = []
    for fragment in dataset.get_fragments():
        partition = ds.get_partition_keys(fragment.partition_expression)
        name = output.url_of(input_path, fragment.path)
        for group in fragment.split_by_row_group():
            (row_group,) = group.row_groups
            units.append(Unit(name, row_group.id, row_group.num_rows, partition))
    return units


def share(units: Sequence[Unit], tasks: int) -> list[list[Unit]]:
    """``units`` in at most ``tasks`` shares of about as many rows (the
    largest first, each to the share with fewest rows), each share in input
    order; none empty."""
    shares: list[list[int]] = [[] for _ in range(max(1, min(tasks, len(units))))]
    sizes = [0] * len(shares)
    for index in sorted(range(len(units)), key=lambda i: -units[i].rows):
        least = sizes.index(min(sizes))
        shares[least].append(index)
        sizes[least] += units[index].rows
    return [[units[i] for i in sorted(share)] for share in shares if share]


def read_units(
    units: Sequence[Unit],
    fed: pa.Schema,
    batch_rows: int,
    skip: Mapping[str, Sequence[int]] | None = None,
    settings: ObjectStoreSettings | None = None,
) -> Iterator[pa.RecordBatch]:
    """The ``fed`` columns of ``units``, ``batch_rows`` rows a batch, typed as
    ``fed`` says (as Spark would hand them over): a Hive partition's value
    for a partition column, nulls for a column a file lacks; without the
    rows ``skip`` names (by index in their file). Files named by URL are
    read from the store ``settings`` describes (default: the environment's)."""
    import pyarrow.parquet as pq

    opened = output.Filesystems(settings or ObjectStoreSettings())
    # A file's row groups in a share follow each other: each file opened once.
    for path, of_file in groupby(units, key=lambda u: u.path):
        groups = list(of_file)
        filesystem, located = opened(path)
        # Spark's INT96 timestamps are microseconds.
        parquet = pq.ParquetFile(located, coerce_int96_timestamp_unit="us", filesystem=filesystem)
        try:
            yield from _read_file(parquet, path, groups, fed, batch_rows, skip)
        finally:
            parquet.close()


def _read_file(
    parquet: Any,
    path: str,
    groups: list[Unit],
    fed: pa.Schema,
    batch_rows: int,
    skip: Mapping[str, Sequence[int]] | None,
) -> Iterator[pa.RecordBatch]:
    """``read_units`` of one file's ``groups``."""
    import pyarrow as pa

    partition = groups[0].partition
    present = set(parquet.schema_arrow.names)
    stored = [field.name for field in fed if field.name in present]
    dropped = (skip or {}).get(path)
    if dropped:
        read = _without(parquet, [g.row_group for g in groups], stored, batch_rows, dropped)
    else:
        read = parquet.iter_batches(
            batch_size=batch_rows, row_groups=[g.row_group for g in groups], columns=stored
        )
    for batch in read:
        rows = batch.num_rows
        arrays = []
        for field in fed:
            if field.name in present:
                arrays.append(batch.column(field.name).cast(field.type))
            elif field.name in partition:
                value = pa.scalar(partition[field.name])
                arrays.append(pa.repeat(value, rows).cast(field.type))
            else:
                arrays.append(pa.nulls(rows, field.type))
        yield pa.RecordBatch.from_arrays(arrays, schema=fed)


def _without(
    parquet: Any, row_groups: list[int], columns: list[str], batch_rows: int, rows: Sequence[int]
) -> Iterator[pa.RecordBatch]:
    """``row_groups``' batches without ``rows`` (indices in the file): a row
    group at a time, so that each batch's place in the file is known."""
    import pyarrow as pa

    metadata = parquet.metadata
    starts = np.cumsum(
        [0] + [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    )
    skipped = np.asarray(sorted(rows), dtype=np.int64)
    for group in row_groups:
        first = int(starts[group])
        for batch in parquet.iter_batches(
            batch_size=batch_rows, row_groups=[group], columns=columns
        ):
            at = np.arange(first, first + batch.num_rows, dtype=np.int64)
            first += batch.num_rows
            kept = ~np.isin(at, skipped)
            if kept.all():
                yield batch
            elif kept.any():
                yield batch.filter(pa.array(kept))


def _runner(
    event_bytes: bytes, cache_dir: str, settings: ObjectStoreSettings
) -> model_loading.Runner:
    event = models_pb2.ModelReady.FromString(event_bytes)
    key = (event.model_name, event.version, event.sha256)
    runner = _RUNNERS.get(key)
    if runner is None:
        # A directory of this worker's own: the workers of one machine fetch
        # at the same time, and each verifies the copy it loads.
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        own = Path(tempfile.mkdtemp(prefix=f"worker-{os.getpid()}-", dir=cache_dir))
        directory = model_loading.fetch(event, own, settings)
        # One thread per task: Spark runs as many tasks as it has cores.
        runner = model_loading.load(event, directory, intra_op_threads=1)
        _RUNNERS[key] = runner
    return runner
