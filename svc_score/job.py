"""The Spark side of scoring: plan the job on the driver, score the input
in Arrow batches on the executors (``svc_score.tasks``: each task reads its
row groups, or is handed the rows a ``--where`` keeps, scores them and
writes its own Parquet file with pyarrow), then write the run's lineage:
each output file's rows and the clean-event offsets under them, as the
tasks report them. A row keeps its own ``sources`` only on request
(``row_sources``). Of the offline store, each window is scored once, as the
store's other readers read it: the latest batch's row
(``shared.offline_store.superseded``).

Input and output are each a local path or a URL on the object store
(``s3://``, ``s3a://``): Spark reads the input as ``s3a://``, the tasks
through s3fs, and the output is committed by ``svc_score.output.Staged``
(on the store: copied into place, ``_lineage.json`` written last as the
output's marker).
"""

from __future__ import annotations

import functools
import hashlib
import json
import posixpath
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from google.protobuf import json_format

from shared import model_loading, offline_store
from shared import object_store as stores
from shared.contracts.aistack.v1 import models_pb2
from shared.errors import AistackError, InvalidArgument
from shared.log import get_logger
from shared.settings import ObjectStoreSettings
from svc_score import output as outputs
from svc_score import tasks
from svc_score.parquet_input import read_parquet
from svc_score.plan import ROW_SOURCES, BadInput, plan
from svc_score.publish import Layout, Publication, publish

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pyspark.sql import SparkSession

log = get_logger("svc_score")

#: The file beside the output's Parquet files that says where they came from
#: (on the object store, the output's marker: written last).
LINEAGE_FILE = outputs.LINEAGE_FILE
#: Under the cache directory: the executors' copies of artifacts.
EXECUTORS = "executors"
#: Spark's rows per Arrow batch, and so per model call, either way a task reads.
_BATCH_ROWS = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: The most rows a task reads, unless the cores' shares are larger.
_ROWS_PER_TASK = 5_000_000
#: Tasks a core runs, one after another, of an input's row groups.
TASKS_PER_CORE = 2
#: What ``input_digest`` fingerprints.
DIGEST_OF = "sha256 over each input file's path, size and mtime (on the object store, ETag)"


@dataclass(frozen=True)
class Scored:
    output: Path | str  # a URL for an output on the object store
    rows: int
    lineage: dict[str, Any]


def score(
    spark: SparkSession,
    event: models_pb2.ModelReady,
    *,
    input_path: str,
    output: Path | str,
    cache_dir: Path,
    columns: tuple[str, ...] = (),
    where: str = "",
    publish_to: Publication | None = None,
    row_sources: bool = False,
    object_store: ObjectStoreSettings | None = None,
) -> Scored:
    """Score every row of the Parquet at ``input_path`` with ``event``'s
    model into a new directory ``output``: Parquet files and ``LINEAGE_FILE``;
    each a local path or a URL (``s3://``, ``s3a://``) on the store
    ``object_store`` describes (default: the environment's; ``spark`` must
    reach it too, ``shared.spark_session``);
    only the rows that match ``where`` (a Spark SQL condition) when given;
    with ``publish_to``, each output row to that topic too (``publish``).
    Each row keeps the input's ``sources`` when ``row_sources`` (or
    ``publish_to``: a record names its window's sources); each file's
    lineage has them either way.

    The output appears whole or not at all: the tasks write beside it, and
    once the job (and the publishing) has succeeded a local directory is
    renamed into place; on the store the files are copied into place and
    ``LINEAGE_FILE`` written last, the marker that the output is whole
    (``svc_score.output.Staged``). Raises
    InvalidArgument (the output exists, the input is not Parquet), BadInput
    (see ``plan``), ArtifactRejected (a tampered or unloadable artifact, on
    the driver before any row is read)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    store = object_store or ObjectStoreSettings()
    staged = outputs.Staged(output, store)
    staged.refuse_existing()
    # The driver verifies first: a tampered artifact stops here, before a task runs.
    verified = model_loading.fetch(event, cache_dir / "driver", store)
    try:
        try:
            frame = read_parquet(spark, input_path, store)
        except Exception as exc:  # AnalysisException: no such path, not Parquet
            raise InvalidArgument(
                f"{input_path}: cannot read it as Parquet: {_first_line(exc)}"
            ) from exc
        files = sorted(frame.inputFiles())
        digest = input_digest(files, store)
        if where:
            # The offline store's rule first (a window a later batch wrote
            # again is read once), then the condition.
            if offline_store.superseded([_file_name(name) for name in files], store):
                frame = offline_store.latest_batch_rows(frame)
            frame = _filtered(frame, where)
        types = {field.name: field.dataType.simpleString() for field in frame.schema.fields}
        chosen = plan(event, types, columns, row_sources=row_sources or publish_to is not None)
        feed = list(dict.fromkeys([*chosen.keys, *chosen.columns]))
        merge = ROW_SOURCES if ROW_SOURCES in types else ""
        if merge and merge not in feed:
            feed.append(merge)
        # The schema of the columns fed, from the frame's own: a select
        # costs the driver a twentieth of a second of the JVM's analysis.
        fed_arrow = to_arrow_schema(StructType([frame.schema[name] for name in feed]))
        schema = tasks.output_schema(chosen, fed_arrow)
        run_id = uuid.uuid4().hex
        task = tasks.Task.of(
            chosen,
            fed_arrow,
            schema,
            merge,
            cache_dir=str(cache_dir / EXECUTORS),
            staging=staged.staging,
            run_id=run_id,
            batch_rows=int(spark.conf.get(_BATCH_ROWS, "10000") or 10000),
            object_store=store,
        )
        staged.create()
        try:
            if where:  # Spark SQL: Spark reads and filters
                fed = frame.select(*feed)
                scored = fed.mapInArrow(tasks.from_spark(task), tasks.WRITTEN_SCHEMA).collect()
                written = [tasks.Written(r.file, int(r.rows), r.sources) for r in scored]
            else:
                written = _from_files(spark, task, input_path)
        except AistackError:
            raise
        except Exception as exc:  # a task failed: Spark wraps the worker's error
            raise JobFailed(f"the Spark job failed: {_python_error(exc)}") from exc
        if not written:  # no row matched: one file says what the output holds
            outputs.write_empty(
                outputs.join(staged.staging, tasks.file_name(task, 0)), schema, store
            )
        rows = sum(w.rows for w in written)
        lineage: dict[str, Any] = {
            "run_id": run_id,
            "model": event.model_name,
            "version": event.version,
            "artifact_sha256": event.sha256,
            "artifact_uri": event.artifact_uri,
            "input": input_path,
            "input_files": len(files),
            "input_digest": digest,
            "input_digest_of": DIGEST_OF,
            "columns": list(chosen.columns),
            "where": where,
            "rows": rows,
            # How the model came to be: study, trial, parameters, training files.
            "model_lineage": json_format.MessageToDict(event.lineage),
            "files": files_lineage(written, staged.parquet_files()),
        }
        if publish_to is not None:
            layout = Layout.of(chosen, types)
            try:
                published = publish(spark, staged.staging, layout, run_id, publish_to)
            except Exception as exc:  # a task could not deliver its records
                raise JobFailed(
                    f"publishing to {publish_to.topic} failed: {_python_error(exc)}"
                ) from exc
            lineage["published"] = {"topic": publish_to.topic, "records": published}
        try:
            staged.commit(lineage)
        except AistackError:
            raise
        except Exception as exc:  # the store's own error, not an outage
            raise JobFailed(f"writing {staged.output} failed: {_first_line(exc)}") from exc
    finally:
        staged.discard()
        shutil.rmtree(verified, ignore_errors=True)
    log.info("score.written", model=event.model_name, version=event.version, rows=rows)
    return Scored(output, rows, lineage)


def _from_files(spark: SparkSession, task: tasks.Task, input_path: str) -> list[tasks.Written]:
    """Every row of the input, each task reading its share of the row groups
    (``tasks.from_files``): ``TASKS_PER_CORE`` shares a core, of about as
    many rows, and more where a share would pass ``_ROWS_PER_TASK`` (a
    failed task costs its share again). Two waves, not one: a core that the
    driver's JVM or anything else slows takes fewer shares, and the other
    more (a million rows on ``local[2]``, six alternating runs: 4 tasks 0.86
    s, 8 tasks 0.87 s, 2 tasks 0.93 s, the single process 0.85 s). A wave
    costs Spark's scheduling and the workers' hand-over, 50 ms of empty
    tasks on two cores here, and cost a full collection of each worker's
    heap too before ``shared.spark_daemon`` (4 and 8 tasks 1.19 and 1.65 s
    against 1.04 s in 2)."""
    try:
        units = tasks.units_of(input_path, task.object_store)
    except Exception as exc:  # pyarrow: what Spark read, it could not
        raise InvalidArgument(
            f"{input_path}: cannot read it as Parquet: {_first_line(exc)}"
        ) from exc
    if not units:
        return []
    context = spark.sparkContext
    rows = sum(unit.rows for unit in units)
    wanted = max(TASKS_PER_CORE * context.defaultParallelism, -(-rows // _ROWS_PER_TASK))
    shares = tasks.share(units, wanted)
    # A window of the offline store a later batch wrote again is scored once.
    skip = offline_store.superseded(sorted({unit.path for unit in units}), task.object_store)
    if skip:
        task = replace(task, skip=tuple((path, tuple(rows)) for path, rows in sorted(skip.items())))
    run = tasks.from_files(task)
    return list(
        context.parallelize(shares, len(shares))
        .mapPartitionsWithIndex(lambda index, share: run(index, (u for s in share for u in s)))
        .collect()
    )


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


def files_lineage(written: list[tasks.Written], files: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per Parquet file of the output (``files``, their names): its rows
    and, where the input carries its windows' ``sources``, the clean-event
    offsets under its rows, merged per partition (min, max, count), as each
    task reported them. A file no task wrote (the empty output's) has its
    rows only."""
    lineage: dict[str, dict[str, Any]] = {}
    for name in files:
        lineage[name] = {"rows": 0}
    for row in written:
        entry: dict[str, Any] = {"rows": int(row.rows)}
        if row.sources is not None:
            entry["sources"] = json.loads(row.sources)
        lineage[row.file] = entry
    return dict(sorted(lineage.items()))


def input_digest(files: list[str], settings: ObjectStoreSettings | None = None) -> str:
    """sha256 over each file's name, size and version (not its bytes: a
    cheap fingerprint that changes when a file is rewritten): a local file's
    absolute path and modification time; an object's path on its bucket
    (``s3://`` and ``s3a://`` name it alike) and ETag (else its
    LastModified), all from one listing of the objects' common prefix on
    the store ``settings`` describes (default: the environment's).
    ``files`` are paths, ``file:`` URIs or URLs, as Spark lists them."""
    lines = []
    for path in sorted(_local(name) for name in files if not outputs.is_remote(name)):
        stat = path.stat()
        lines.append(f"{path}\t{stat.st_size}\t{stat.st_mtime_ns}")
    remote = [_file_name(name) for name in files if outputs.is_remote(name)]
    if remote:
        lines += _object_fingerprints(remote, settings or ObjectStoreSettings())
    sha = hashlib.sha256()
    for line in lines:
        sha.update(f"{line}\n".encode())
    return sha.hexdigest()


def _object_fingerprints(urls: list[str], settings: ObjectStoreSettings) -> list[str]:
    """(path, size, ETag) of each object of ``urls``, sorted: one listing."""
    fs, _ = stores.filesystem(urls[0], settings)
    paths = sorted({str(fs._strip_protocol(url)).rstrip("/") for url in urls})
    common = posixpath.commonpath([posixpath.dirname(path) for path in paths])
    what = stores.where(urls[0], settings)
    listing: dict[str, dict[str, Any]] = stores.ride_out(
        lambda: fs.find(common, detail=True), seconds=settings.ride_out_s, what=what
    )
    lines = []
    for path in paths:
        info = listing.get(path)
        if info is None:  # not under the listed prefix as named: asked alone
            info = stores.ride_out(
                functools.partial(fs.info, path), seconds=settings.ride_out_s, what=what
            )
        version = info.get("ETag") or info.get("LastModified") or info.get("mtime") or ""
        lines.append(f"{path}\t{info.get('size')}\t{str(version).strip(chr(34))}")
    return lines


def _file_name(name: str) -> str:
    """A file as Spark lists it, as fsspec and pyarrow name it: a local path,
    or a URL whose path Hadoop no longer escapes (``%20``)."""
    if not outputs.is_remote(name):
        return str(_local(name))
    scheme, _, path = name.partition("://")
    return f"{scheme}://{unquote(path)}"


def _local(name: str) -> Path:
    # Hadoop writes local files as file:/path, with one slash.
    if name.startswith("file:"):
        return Path(unquote(urlparse(name).path)).resolve()
    return Path(name).resolve()
