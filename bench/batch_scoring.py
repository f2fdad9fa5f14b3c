"""Batch scoring (svc_score's Spark job) against itself on more cores and
against a plain single-process loop: same model, data and batch size, in
the same run.

Data: ``--rows`` (default 1,000,000) windows in the offline store's layout
(``shared.feature_store``: Hive partitions ``date=/metric=/window=/batch=``,
``OFFLINE_COLUMNS`` as Spark writes them, INT96 timestamps), one file in each
of 8 partitions, seeded; written once per run. The warm-up reads a small
store of the same layout (20,000 rows in 8 files, so that each of Spark's
cores runs a task of it).

Model: the trainer's forecasting MLP for the ``features`` dataset (one lag:
``len(FEATURE_STATS)`` values per row in, one prediction out), built by
``svc_trainer.backends.torch.models`` with the default hyperparameters, seeded and
untrained (the weights change nothing a row costs), and exported by
``svc_trainer.backends.torch.runner.export`` (torch.export). The bench builds the
ModelReady event the trainer would publish for it and calls
``svc_score.job.score`` with it directly: no broker, no models topic
(``svc_score.app.run`` only adds reading that event from Kafka).

Contenders, each timed over reading, scoring and writing every row (for
``job.score``, all it does: the driver's artifact check, the job, the row
count, the lineage file), with ``BATCH`` rows per model call:

1. ``spark local[2]``: ``job.score`` in a fresh SparkSession on
   ``local[2]`` started as ``aistack score`` starts it
   (``svc_score.app.start_session``, with
   ``spark.sql.execution.arrow.maxRecordsPerBatch``); each Python worker
   loads the model with one thread, as the job does.
2. ``spark local[1]``: the same on ``local[1]``.
3. ``single process (1 core)``: pyarrow reads the same store in batches of
   the same size, the same verified model (``shared.model_loading``, one
   thread) scores them, pyarrow writes Parquet of the Spark job's output
   columns with the encodings its tasks choose, one file per input file;
   the process pinned to one core while it runs (``os.sched_setaffinity``),
   pyarrow's threads with it. Spark on two cores against a plain loop on
   one: the choice a user of this machine has.

Before each timed run the contender starts afresh (a new SparkSession whose
workers load the model; for the single process, fetch, verify and load)
and scores the warm-up store, untimed. A round runs each contender once, in
``bench.harness.round_order``; ``--repeats`` rounds (default 3), the median
counts. Every run must write every row, and the contenders' predictions
must agree.

Prints what each figure is made of, then, higher always better:

    spark_scaling_2_vs_1: ratio R (goal 1.8) [aistack against itself]
    spark_vs_single_process: ratio R (goal 0.9)

Needs no broker. Keep other work off the machine's cores while it runs.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import profiling
from bench.harness import print_ratio, round_order

if TYPE_CHECKING:
    import pyarrow as pa
    from numpy.typing import NDArray

    from shared.contracts.aistack.v1 import models_pb2
    from shared.model_loading import Runner

ROWS = 1_000_000
#: Rows per model call: Spark's Arrow batch, the single process's read batch.
BATCH = 10_000
FILES = 8
WARM_ROWS = 20_000
REPEATS = 3
SEED = 19

SCALING_GOAL = 1.8
OVERHEAD_GOAL = 0.9

MODEL = "bench-forecaster"
METRIC = "temperature"
WINDOW = "tumbling-60s"
FIRST_DATE = datetime(2025, 1, 1, tzinfo=UTC)
# Most windows one entity has in one date partition (a day of 60 s windows).
WINDOWS_PER_DAY = 1440
MIN_ENTITIES = 1000

SPARK_2 = "spark local[2]"
SPARK_1 = "spark local[1]"
SINGLE = "single process (1 core)"


# ---- the data: the offline store's layout ----


def offline_table(rows: int, *, day: int, seed: int) -> pa.Table:
    """``rows`` closed windows of one date partition (``day`` days after
    ``FIRST_DATE``), in ``OFFLINE_COLUMNS`` order with the types Spark
    writes; every entity's windows follow each other, 60 s apart."""
    import numpy as np
    import pyarrow as pa

    from shared.feature_store import OFFLINE_COLUMNS

    rng = np.random.default_rng([seed, day])
    entities = max(MIN_ENTITIES, math.ceil(rows / WINDOWS_PER_DAY))
    index = np.arange(rows)
    names = np.array([f"device-{i:05d}" for i in range(entities)])
    start_us = (
        int((FIRST_DATE + timedelta(days=day)).timestamp()) * 1_000_000
        + (index // entities) * 60_000_000
    )
    mean = rng.normal(20.0, 5.0, rows)
    stddev = np.abs(rng.normal(1.0, 0.5, rows))
    count = rng.poisson(60, rows).astype(np.int64) + 1
    timestamp = pa.timestamp("us", tz="UTC")
    columns: dict[str, pa.Array] = {
        # 32 hex characters, as svc_transform's sha2-based key.
        "window_key": pa.array(np.frombuffer(rng.bytes(16 * rows).hex().encode(), "S32")).cast(
            pa.string()
        ),
        "entity_id": pa.array(names[index % entities]),
        "path": pa.array(np.full(rows, "")),
        "unit": pa.array(np.full(rows, "degC")),
        "window_start": pa.array(start_us, timestamp),
        "window_end": pa.array(start_us + 60_000_000, timestamp),
        "window_size": pa.array(np.full(rows, 60, np.int64)),
        "window_slide": pa.array(np.full(rows, 60, np.int64)),
        "count": pa.array(count),
        "mean": pa.array(mean),
        "min": pa.array(mean - 2 * stddev),
        "max": pa.array(mean + 2 * stddev),
        "stddev": pa.array(stddev),
        "last": pa.array(mean + rng.normal(0.0, 0.5, rows)),
        "p50": pa.array(mean + rng.normal(0.0, 0.1, rows)),
        "p95": pa.array(mean + 1.645 * stddev),
        # Null for a metric without errors, as svc_transform writes it.
        "error_rate": pa.nulls(rows, pa.float64()),
        "last_event_time": pa.array(start_us + 59_000_000, timestamp),
        "sources": _sources(names, index % entities, count, day=day),
    }
    return pa.table([columns[name] for name in OFFLINE_COLUMNS], names=list(OFFLINE_COLUMNS))


#: The clean topic's partitions, for the stored windows' offset ranges.
CLEAN_PARTITIONS = 3


def _sources(
    names: NDArray[Any], entity: NDArray[Any], count: NDArray[Any], *, day: int
) -> pa.Array:
    """Each window's ``sources``, as svc_transform writes them: its ``count``
    clean events from its entity's partition (by name, as a keyed topic), the
    partition's offsets running on from window to window and day to day."""
    import numpy as np
    import pyarrow as pa

    partition = np.array([zlib.crc32(n.encode()) % CLEAN_PARTITIONS for n in names])[entity]
    max_offset = np.empty(len(count), np.int64)
    for p in range(CLEAN_PARTITIONS):
        chosen = partition == p
        # A day of every partition holds less than a billion events.
        max_offset[chosen] = day * 1_000_000_000 + np.cumsum(count[chosen]) - 1
    ranges = pa.StructArray.from_arrays(
        [
            pa.array(np.full(len(count), "aistack.events.clean")),
            pa.array(partition, pa.int32()),
            pa.array(max_offset - count + 1),
            pa.array(max_offset),
            pa.array(count),
        ],
        names=["topic", "partition", "min_offset", "max_offset", "count"],
    )
    # One range a window: the topic is keyed by entity.
    return pa.ListArray.from_arrays(pa.array(np.arange(len(count) + 1, dtype=np.int32)), ranges)


def split_rows(rows: int, parts: int) -> list[int]:
    """``rows`` in ``parts`` sizes that differ by one at most, larger first."""
    if rows < parts or parts < 1:
        raise ValueError(f"cannot split {rows} rows into {parts} non-empty files")
    size, extra = divmod(rows, parts)
    return [size + (1 if i < extra else 0) for i in range(parts)]


def write_store(root: Path, rows: int, *, files: int = FILES, seed: int = SEED) -> int:
    """An offline store of ``rows`` windows under ``root``: one Parquet file
    in each of ``files`` date partitions, as svc_transform's sink writes it.
    Returns the rows written."""
    import pyarrow.parquet as pq

    from shared.feature_store import partition_path

    for day, count in enumerate(split_rows(rows, files)):
        date = (FIRST_DATE + timedelta(days=day)).strftime("%Y-%m-%d")
        folder = root / partition_path(date=date, metric=METRIC, window=WINDOW, batch=day)
        folder.mkdir(parents=True)
        pq.write_table(
            offline_table(count, day=day, seed=seed),
            folder / "part-00000.c000.snappy.parquet",
            use_deprecated_int96_timestamps=True,
        )
    (root / "_SUCCESS").touch()
    return rows


# ---- the model, as the trainer exports and announces it ----


def export_model(directory: Path, seed: int = SEED) -> models_pb2.ModelReady:
    """The trainer's ``features`` MLP exported into ``directory``, and the
    ModelReady event the trainer would publish for it."""
    import numpy as np
    import torch

    from shared.artifacts import digest
    from shared.contracts.aistack.v1 import common_pb2, models_pb2
    from shared.feature_store import FEATURE_STATS, online_field
    from svc_trainer.backends.torch import models as torch_models
    from svc_trainer.backends.torch import runner as torch_runner
    from svc_trainer.plan import TASK_REGRESSION, DataSplits, Hyperparams

    rng = np.random.default_rng(seed)
    x = rng.normal(20.0, 5.0, (64, len(FEATURE_STATS))).astype(np.float32)
    y = x[:, 0] + rng.normal(0.0, 1.0, 64).astype(np.float32)
    feature = online_field(METRIC, WINDOW)
    data = DataSplits(
        name="features",
        version="bench",
        task=TASK_REGRESSION,
        x_train=x,
        y_train=y,
        x_val=x[:8],
        y_val=y[:8],
        x_test=x[:8],
        y_test=y[:8],
        source="bench.batch_scoring",
        feature=feature,
    )
    torch.manual_seed(seed)
    model = torch_models.build("mlp", Hyperparams(), data).eval()
    torch_runner.export(model, data, directory)
    sha, size = digest(directory)
    inputs, outputs = torch_models.signature(data)
    return models_pb2.ModelReady(
        model_name=MODEL,
        version="1",
        framework=common_pb2.FRAMEWORK_TORCH,
        format=models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT,
        artifact_uri=directory.as_uri(),
        sha256=sha,
        size_bytes=size,
        inputs=[
            models_pb2.TensorSpec(name=s.name, datatype=s.datatype, shape=list(s.shape))
            for s in inputs
        ],
        outputs=[
            models_pb2.TensorSpec(name=s.name, datatype=s.datatype, shape=list(s.shape))
            for s in outputs
        ],
        objective=common_pb2.Objective(metric="val_error", direction=common_pb2.DIRECTION_MINIMIZE),
        labels={"feature": feature},
    )


# ---- the peer: one process, pyarrow and the loaded model ----


def spark_types(schema: pa.Schema) -> dict[str, str]:
    """An Arrow schema's columns as the Spark SQL types ``svc_score.plan``
    checks (``DataType.simpleString``), for the numbers it reads."""
    import pyarrow as pa

    types: dict[str, str] = {}
    for field in schema:
        if pa.types.is_integer(field.type):
            types[field.name] = "bigint"
        elif pa.types.is_floating(field.type):
            types[field.name] = "double"
        else:
            types[field.name] = "string"
    return types


def score_arrow(
    runner: Runner, event: models_pb2.ModelReady, store: Path, output: Path, *, batch: int = BATCH
) -> int:
    """Score every row of the Parquet store at ``store`` into ``output`` (a
    new directory, one file per input file): the Spark job's output columns,
    ``batch`` rows per model call. Returns the rows written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from shared.model_loading import NUMPY_TYPES
    from svc_score.plan import plan
    from svc_score.tasks import dictionary_columns

    dataset = ds.dataset(store, format="parquet", partitioning="hive")
    chosen = plan(event, spark_types(dataset.schema))
    (signature,) = runner.inputs
    dtype = NUMPY_TYPES[signature.datatype]
    output.mkdir(parents=True)
    written = 0
    for number, fragment in enumerate(dataset.get_fragments()):
        writer: pq.ParquetWriter | None = None
        for records in fragment.to_batches(
            columns=[*chosen.keys, *chosen.columns], batch_size=batch
        ):
            rows = records.num_rows
            x = np.column_stack(
                [records.column(c).to_numpy(zero_copy_only=False) for c in chosen.columns]
            ).astype(dtype)
            predicted = runner.run({signature.name: x.reshape((rows, *chosen.row_shape))})
            arrays = [records.column(key) for key in chosen.keys]
            names = list(chosen.keys)
            for name, _, scalar in chosen.outputs:
                values = np.asarray(predicted[name]).reshape(rows, -1)
                arrays.append(pa.array(values[:, 0]) if scalar else pa.array(list(values)))
                names.append(name)
            arrays += [pa.repeat(event.model_name, rows), pa.repeat(event.version, rows)]
            names += ["model_name", "model_version"]
            scored = pa.RecordBatch.from_arrays(arrays, names=names)
            if writer is None:
                # The same encodings as the job's tasks choose.
                writer = pq.ParquetWriter(
                    output / f"part-{number:05d}.parquet",
                    scored.schema,
                    use_dictionary=dictionary_columns(chosen.keys),
                )
            writer.write_batch(scored)
            written += rows
        if writer is not None:
            writer.close()
    return written


# ---- runs ----


@dataclass(frozen=True)
class Run:
    """One timed run: rows written, seconds, and the sum of the predictions
    (the check that each contender did the same work)."""

    rows: int
    seconds: float
    checksum: float


@dataclass(frozen=True)
class Figure:
    """One contender's timed runs."""

    name: str
    runs: tuple[Run, ...]

    @property
    def rows(self) -> int:
        return self.runs[0].rows

    @property
    def seconds(self) -> float:
        """The median run's seconds."""
        return statistics.median(run.seconds for run in self.runs)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds

    def line(self) -> str:
        each = ", ".join(f"{run.seconds:.2f}" for run in self.runs)
        return (
            f"{self.name}: {self.rows:,} rows in {self.seconds:.2f} s (median of {each}) "
            f"= {self.rows_per_second:,.0f} rows/s"
        )


@dataclass(frozen=True)
class Setup:
    """What every contender reads and loads, made once per run."""

    event: models_pb2.ModelReady
    store: Path
    warm_store: Path
    rows: int
    work: Path


def prediction_sum(output: Path) -> float:
    """The sum of the predictions under ``output`` (Spark's ``_`` and ``.``
    files skipped, as Parquet readers do)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    table = ds.dataset(output, format="parquet").to_table(columns=["prediction"])
    return float(pc.sum(table.column("prediction").cast("float64")).as_py())


def run_spark(setup: Setup, cores: int, label: str) -> Run:
    """A fresh SparkSession on ``local[cores]``, the warm-up, one timed job."""
    from shared.settings import SparkSettings
    from svc_score import app, job

    master = f"local[{cores}]"
    settings = SparkSettings(
        master=master, conf={"spark.sql.execution.arrow.maxRecordsPerBatch": str(BATCH)}
    )
    spark = app.start_session(
        settings,
        work_dir=setup.work / "spark",
        cache_dir=setup.work / "jars",
        object_store=None,
        rows_through_jvm=False,
    )
    try:
        # getOrCreate joins a session left running: this one must be on the master asked for.
        if spark.sparkContext.master != master:
            raise RuntimeError(f"expected a session on {master}, got {spark.sparkContext.master}")
        cache = setup.work / f"cache-{label}"
        job.score(
            spark,
            setup.event,
            input_path=str(setup.warm_store),
            output=setup.work / f"warm-{label}",
            cache_dir=cache,
        )
        output = setup.work / f"out-{label}"
        started = time.perf_counter()
        scored = job.score(
            spark, setup.event, input_path=str(setup.store), output=output, cache_dir=cache
        )
        seconds = time.perf_counter() - started
    finally:
        spark.stop()
    return Run(scored.rows, seconds, prediction_sum(output))


def run_single(setup: Setup, label: str) -> Run:
    """Fetch, verify and load the model (one thread), the warm-up, one timed
    run, all on one core."""
    from shared import model_loading

    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    try:
        directory = model_loading.fetch(setup.event, setup.work / f"cache-{label}")
        runner = model_loading.load(setup.event, directory, intra_op_threads=1)
        score_arrow(runner, setup.event, setup.warm_store, setup.work / f"warm-{label}")
        output = setup.work / f"out-{label}"
        started = time.perf_counter()
        rows = score_arrow(runner, setup.event, setup.store, output)
        seconds = time.perf_counter() - started
    finally:
        os.sched_setaffinity(0, cores)
    return Run(rows, seconds, prediction_sum(output))


def measure(setup: Setup, repeats: int) -> dict[str, Figure]:
    contenders: Mapping[str, Callable[[str], Run]] = {
        SPARK_2: lambda label: run_spark(setup, 2, label),
        SPARK_1: lambda label: run_spark(setup, 1, label),
        SINGLE: lambda label: run_single(setup, label),
    }
    runs: dict[str, list[Run]] = {name: [] for name in contenders}
    for number in range(repeats):
        for name in round_order(list(contenders), number):
            label = f"{re.sub(r'[^a-z0-9]+', '-', name).strip('-')}-{number}"
            run = contenders[name](label)
            for leftover in setup.work.glob(f"*-{label}"):
                shutil.rmtree(leftover)
            if run.rows != setup.rows:
                raise RuntimeError(f"{name} wrote {run.rows} rows of {setup.rows}")
            print(f"  round {number + 1}, {name}: {run.seconds:.2f} s", flush=True)
            runs[name].append(run)
    check_same_predictions(runs)
    return {name: Figure(name, tuple(done)) for name, done in runs.items()}


def check_same_predictions(runs: Mapping[str, list[Run]]) -> None:
    """Raises RuntimeError unless every run's predictions sum to the same
    (float32 sums in another order: a relative 1e-5)."""
    sums = {name: run.checksum for name, done in runs.items() for run in done}
    first = next(iter(sums.values()))
    for name, value in sums.items():
        if not math.isclose(value, first, rel_tol=1e-5):
            raise RuntimeError(f"{name}'s predictions sum to {value}, another's to {first}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_scoring", description=__doc__)
    parser.add_argument("--rows", type=int, default=ROWS, help="rows in the offline store")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed rounds; median counts")
    profiling.add_flag(parser, "batch_scoring", own_children=True)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.rows < FILES:
        parser.error(f"--rows must be at least {FILES}")
    with tempfile.TemporaryDirectory(prefix="aistack-bench-score-") as tmp:
        work = Path(tmp)
        event = export_model(work / "model")
        rows = write_store(work / "store", args.rows)
        write_store(work / "warm-store", WARM_ROWS, seed=SEED + 1)
        setup = Setup(event, work / "store", work / "warm-store", rows, work)
        print(
            f"batch scoring: {rows:,} rows in {FILES} files, {BATCH:,} rows per batch, "
            f"{args.repeats} round(s)",
            flush=True,
        )
        figures = measure(setup, args.repeats)
    for figure in figures.values():
        print(figure.line(), flush=True)
    two, one, single = figures[SPARK_2], figures[SPARK_1], figures[SINGLE]
    print_ratio(
        "spark_scaling_2_vs_1",
        two.rows_per_second / one.rows_per_second,
        SCALING_GOAL,
        itself=True,
    )
    print_ratio(
        "spark_vs_single_process", two.rows_per_second / single.rows_per_second, OVERHEAD_GOAL
    )


if __name__ == "__main__":
    main()
