"""``aistack score`` on the real broker and a local Spark: the predictions are
svc_model's, and every refusal is one line with nothing written."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aistack import cli
from shared.bus.topics import ensure_topics
from shared.contracts.aistack.v1 import predictions_pb2
from shared.errors import InvalidArgument
from shared.feature_store import merge_source_column
from shared.model_loading import CHECKSUM_MISMATCH, ArtifactRejected
from svc_score import app, job
from svc_score.plan import BadInput, UnknownModel
from svc_score.settings import ScoreSettings
from tests import memory_probe
from tests.infra import Infra, read_topic
from tests.integration import model_support as ms
from tests.spark_cluster import standalone_cluster

pytestmark = pytest.mark.integration

ROWS = 48
COLUMNS = tuple(f"x{i}" for i in range(64))
MODELS = {ms.TORCH: "score-torch", ms.TF: "score-tf"}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ms.Artifact]:
    root = tmp_path_factory.mktemp("score-artifacts")
    return {ms.TORCH: ms.export_torch(root / "torch"), ms.TF: ms.export_tf(root / "tf")}


def source(row: int) -> dict[str, Any]:
    return {
        "topic": "aistack.events.clean",
        "partition": row % 2,
        "min_offset": 10 * row,
        "max_offset": 10 * row + 5,
        "count": 3,
    }


@pytest.fixture(scope="module")
def digits_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A Parquet file of digit images flattened into 64 columns, with keys."""
    x = ms.digits(ROWS, seed=5)
    columns: dict[str, Any] = {
        "entity_id": [f"e{i:03d}" for i in range(ROWS)],
        "window_start": pa.array(np.arange(ROWS, dtype="int64") * 60_000, pa.timestamp("ms")),
        "label": ["ignored"] * ROWS,
        # The offline store's lineage column: each window's clean events.
        "sources": [[source(i)] for i in range(ROWS)],
    }
    flat = x.reshape(ROWS, 64)
    columns.update({name: flat[:, i] for i, name in enumerate(COLUMNS)})
    path = tmp_path_factory.mktemp("score-input") / "digits.parquet"
    pq.write_table(pa.table(columns), path)
    return path, x


@pytest.fixture(scope="module")
def registry(
    infra: Infra, artifacts: dict[str, ms.Artifact], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ScoreSettings, ms.ServerThread]]:
    """Both models on one models topic, version 2 of the torch one tampered
    with, and svc_model serving the topic."""
    tmp = tmp_path_factory.mktemp("score-registry")
    server_settings = ms.settings(infra, tmp, uuid.uuid4().hex[:12])
    ensure_topics(server_settings.kafka, server_settings.topic_specs())
    tampered = artifacts[ms.TORCH].copy_to(tmp / "tampered")
    torch_v1 = ms.event(MODELS[ms.TORCH], 1, artifacts[ms.TORCH], val_error=0.1)
    tf_v1 = ms.event(MODELS[ms.TF], 1, artifacts[ms.TF])
    for first in (torch_v1, tf_v1):
        first.lineage.study_id = "study"
    ms.publish(
        infra,
        server_settings.models_topic,
        torch_v1,
        tf_v1,
        # Worse than version 1: the champion stays 1 (svc_model refuses version 2).
        ms.event(MODELS[ms.TORCH], 2, tampered, val_error=0.5),
    )
    (tampered.directory / "extra").write_text("not what was published")
    server = ms.ServerThread(server_settings.model_copy(update={"keep_versions": 1}))
    settings = ScoreSettings(
        kafka=infra.kafka,
        models_topic=server_settings.models_topic,
        artifact_cache_dir=tmp / "score-cache",
    )
    yield settings, server
    server.stop()


def served(server: ms.ServerThread, name: str, x: np.ndarray) -> np.ndarray:
    for stub in ms.stub(server.address):
        response = stub.ModelInfer(ms.infer_request(name, x), timeout=60)
        return ms.probabilities(response)
    raise AssertionError("no stub")


@pytest.mark.parametrize("framework", [ms.TORCH, ms.TF])
def test_spark_scores_each_row_as_svc_model_serves_it(
    spark: Any,
    registry: tuple[ScoreSettings, ms.ServerThread],
    digits_file: tuple[Path, np.ndarray],
    artifacts: dict[str, ms.Artifact],
    tmp_path: Path,
    framework: str,
) -> None:
    settings, server = registry
    path, x = digits_file
    output = tmp_path / "scored"
    name = MODELS[framework]
    scored = app.run(
        settings, name, input_path=str(path), output=output, columns=COLUMNS, spark=spark
    )
    assert scored.rows == ROWS
    table = pq.read_table(output).to_pydict()
    # Each row's sources stay out of the output unless asked for (below).
    assert set(table) == {
        "entity_id", "window_start", "probabilities", "model_name", "model_version",
    }  # fmt: skip
    order = np.argsort(table["entity_id"])
    got = np.asarray(table["probabilities"], dtype=np.float32)[order]
    np.testing.assert_allclose(got, served(server, name, x), rtol=1e-5, atol=1e-6)
    assert set(table["model_name"]) == {name}
    assert set(table["model_version"]) == {"1"}  # the champion
    lineage = json.loads((output / job.LINEAGE_FILE).read_text())
    assert lineage["model"] == name and lineage["version"] == "1"
    assert lineage["artifact_sha256"] == artifacts[framework].sha256
    assert lineage["input"] == str(path)
    assert lineage["input_digest"] == job.input_digest([str(path)])
    assert lineage["rows"] == ROWS
    assert lineage["model_lineage"]["studyId"] == "study"
    files = lineage["files"]
    assert sorted(files) == sorted(p.name for p in output.glob("*.parquet"))
    assert sum(entry["rows"] for entry in files.values()) == ROWS
    # Over all files, each partition's clean events: the union of the rows' ranges.
    spans = [span for entry in files.values() for span in entry["sources"]]
    for partition in (0, 1):
        mine = [span for span in spans if span["partition"] == partition]
        assert min(span["min_offset"] for span in mine) == partition * 10
        assert max(span["max_offset"] for span in mine) == 10 * (ROWS - 2 + partition) + 5
        assert sum(span["count"] for span in mine) == 3 * ROWS // 2
    before = sorted(output.iterdir())
    with pytest.raises(InvalidArgument, match="exists; scoring writes a new directory"):
        app.run(settings, name, input_path=str(path), output=output, columns=COLUMNS, spark=spark)
    assert sorted(output.iterdir()) == before
    # Asked for, each row keeps its sources: the same rows, and each file's
    # lineage is its rows' sources merged, the same as without them.
    with_sources = tmp_path / "with-sources"
    again = app.run(
        settings, name, input_path=str(path), output=with_sources, columns=COLUMNS,
        row_sources=True, spark=spark,
    )  # fmt: skip
    rows = pq.read_table(with_sources).to_pydict()
    assert [rows["sources"][i] for i in np.argsort(rows["entity_id"])] == [
        [source(i)] for i in range(ROWS)
    ]
    assert {k: v for k, v in rows.items() if k != "sources"} == table
    for name_of, entry in again.lineage["files"].items():
        written = pq.read_table(with_sources / name_of, columns=["sources"])
        assert entry["sources"] == merge_source_column(written.column("sources"))
    assert [entry for _, entry in sorted(again.lineage["files"].items())] == [
        entry for _, entry in sorted(files.items())
    ]


def test_a_missing_column_a_tampered_artifact_and_an_unknown_version_write_nothing(
    spark: Any,
    registry: tuple[ScoreSettings, ms.ServerThread],
    digits_file: tuple[Path, np.ndarray],
    tmp_path: Path,
) -> None:
    settings, _ = registry
    path, _ = digits_file
    output = tmp_path / "scored"
    name = MODELS[ms.TORCH]

    def score(model: str, columns: tuple[str, ...] = COLUMNS) -> None:
        app.run(settings, model, input_path=str(path), output=output, columns=columns, spark=spark)

    with pytest.raises(BadInput, match=r"^the input has no column 'x64'$"):
        score(name, (*COLUMNS[1:], "x64"))
    with pytest.raises(ArtifactRejected, match=r"has sha256 \w+, the event says") as refused:
        score(f"{name}@2")
    assert refused.value.reason == CHECKSUM_MISMATCH
    unknown = r"^model 'score-torch' has no version 7 \(versions: 1, 2\)$"
    with pytest.raises(UnknownModel, match=unknown):
        score(f"{name}@7")
    assert not output.exists()
    assert list(tmp_path.iterdir()) == []


def test_the_command_says_what_is_wrong_in_one_line(
    registry: tuple[ScoreSettings, ms.ServerThread],
    digits_file: tuple[Path, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, _ = registry
    monkeypatch.setenv("AISTACK_KAFKA_BOOTSTRAP", settings.kafka.bootstrap)
    monkeypatch.setenv("AISTACK_SCORE_MODELS_TOPIC", settings.models_topic)
    output = tmp_path / "scored"
    status = cli.main(
        ["score", "nothing-such", "--input", str(digits_file[0]), "--output", str(output)]
    )
    assert status == 1
    err = capsys.readouterr().err
    assert err.startswith("aistack score: unknown model 'nothing-such' (models: ")
    assert len(err.strip().splitlines()) == 1
    assert not output.exists()


def test_where_scores_only_the_rows_it_matches(
    spark: Any,
    registry: tuple[ScoreSettings, ms.ServerThread],
    digits_file: tuple[Path, np.ndarray],
    tmp_path: Path,
) -> None:
    settings, _ = registry
    path = str(digits_file[0])
    name = MODELS[ms.TORCH]
    where = "entity_id < 'e010' AND label = 'ignored'"
    output = tmp_path / "scored"
    scored = app.run(
        settings, name, input_path=path, output=output, columns=COLUMNS, where=where, spark=spark
    )
    assert scored.rows == 10 and scored.lineage["where"] == where
    assert sorted(pq.read_table(output).column("entity_id").to_pylist()) == [
        f"e{i:03d}" for i in range(10)
    ]
    refused = tmp_path / "refused"
    with pytest.raises(BadInput, match=r"^--where 'nothing_such > 1': .*nothing_such"):
        app.run(
            settings,
            name,
            input_path=path,
            output=refused,
            columns=COLUMNS,
            where="nothing_such > 1",
            spark=spark,
        )
    assert not refused.exists()


def test_a_window_a_later_batch_wrote_again_is_scored_once_as_the_latest(
    spark: Any, tmp_path: Path
) -> None:
    """The offline store's rule (``shared.offline_store``): of a window two
    batches wrote, the later batch's row is scored, with or without --where."""
    from bench.batch_scoring import export_model
    from tests.unit.test_trainer_data import Window, write_store

    event = export_model(tmp_path / "model")
    first = [Window("s-1", i, 10.0 + i, stddev=1.0, batch=0) for i in range(4)]
    again = [Window("s-1", i, 50.0 + i, stddev=2.0, batch=1) for i in (2, 3)]
    latest = [*first[:2], *again]
    write_store(tmp_path / "store", first + again)
    write_store(tmp_path / "latest", latest)

    def scored(store: str, name: str, where: str = "") -> dict[tuple[str, Any], float]:
        output = tmp_path / name
        job.score(
            spark, event, input_path=store, output=output, cache_dir=tmp_path / "c", where=where
        )
        table = pq.read_table(output)
        keys = zip(table["entity_id"].to_pylist(), table["window_start"].to_pylist(), strict=True)
        predictions = dict(zip(keys, table["prediction"].to_pylist(), strict=True))
        assert len(predictions) == table.num_rows  # each window once
        return predictions

    want = scored(str(tmp_path / "latest"), "want")
    assert len(want) == 4
    assert scored(str(tmp_path / "store"), "all") == want
    # Spark hands the filtered rows over in other batches: float32 sums in another order.
    assert scored(str(tmp_path / "store"), "where", where="entity_id = 's-1'") == pytest.approx(
        want, rel=1e-5
    )
    lineage = json.loads((tmp_path / "all" / job.LINEAGE_FILE).read_text())
    assert lineage["rows"] == 4


def test_published_predictions_are_the_output_rows_under_the_runs_id(
    spark: Any,
    registry: tuple[ScoreSettings, ms.ServerThread],
    digits_file: tuple[Path, np.ndarray],
    tmp_path: Path,
) -> None:
    settings, _ = registry
    topic = f"score-predictions-{uuid.uuid4().hex[:8]}"
    settings = settings.model_copy(update={"predictions_topic": topic})
    output = tmp_path / "scored"
    name = MODELS[ms.TORCH]
    scored = app.run(
        settings,
        name,
        input_path=str(digits_file[0]),
        output=output,
        columns=COLUMNS,
        publish=True,
        spark=spark,
    )
    assert scored.lineage["published"] == {"topic": topic, "records": ROWS}
    values = read_topic(settings.kafka, topic, wanted=ROWS + 1, timeout=10)
    records = [predictions_pb2.BatchPrediction.FromString(value) for value in values]
    assert len(records) == ROWS  # each row once, nothing more
    table = pq.read_table(output).to_pydict()
    written = dict(zip(table["entity_id"], table["probabilities"], strict=True))
    for record in records:
        assert record.run_id == scored.lineage["run_id"]
        assert (record.model_name, record.model_version) == (name, "1")
        (output_values,) = record.outputs
        assert output_values.name == "probabilities"
        np.testing.assert_allclose(output_values.values, written[record.entity_id], rtol=1e-6)
    starts = sorted(record.window_start.ToMilliseconds() for record in records)
    assert starts == [i * 60_000 for i in range(ROWS)]


def _archive_reads(_: Any) -> Iterator[tuple[list[str], list[str]]]:
    """In a Python worker: the zip archives on its path, and those whose
    directories ``importlib.invalidate_caches`` (pyspark's, before each task)
    reads again."""
    import importlib
    import zipimport

    read = zipimport._read_directory  # type: ignore[attr-defined]
    reads: list[str] = []

    def counted(path: str) -> object:
        reads.append(path)
        return read(path)

    zipimport._read_directory = counted  # type: ignore[attr-defined]
    try:
        importlib.invalidate_caches()
    finally:
        zipimport._read_directory = read  # type: ignore[attr-defined]
    archives = [
        finder.archive
        for finder in sys.path_importer_cache.values()
        if isinstance(finder, zipimport.zipimporter)
    ]
    yield archives, reads


def _varied_store(root: Path) -> None:
    """Hive partitions holding files of most Parquet types (INT96 among
    them), a nested lineage column, and what Spark's listing skips."""
    rows = 4
    table = pa.table(
        {
            "i8": pa.array(range(rows), pa.int8()),
            "u16": pa.array(range(rows), pa.uint16()),
            "u32": pa.array(range(rows), pa.uint32()),
            "i64": pa.array(range(rows), pa.int64()),
            "f32": pa.array([0.5] * rows, pa.float32()),
            "money": pa.array([1] * rows, pa.decimal128(12, 2)),
            "flag": [True] * rows,
            "name": ["a"] * rows,
            "blob": pa.array([b"x"] * rows, pa.binary()),
            "day": pa.array([19000] * rows, pa.date32()),
            "at_utc": pa.array(range(rows), pa.timestamp("ms", tz="UTC")),
            "at_local": pa.array(range(rows), pa.timestamp("us")),
            "tags": [["t"]] * rows,
            "attributes": pa.array([[("k", "v")]] * rows, pa.map_(pa.string(), pa.string())),
            "sources": [[source(i)] for i in range(rows)],
        }
    )
    for day, batch in (("2025-01-02", 1), ("2025-01-01", 0)):
        folder = root / f"date={day}" / "metric=temperature" / f"batch={batch}"
        folder.mkdir(parents=True)
        pq.write_table(table, folder / "part-00000.parquet")
    legacy = root / "date=2025-01-03" / "metric=temperature" / "batch=2"
    legacy.mkdir(parents=True)
    # Spark's default timestamp type: INT96, without Spark's schema in the footer.
    pq.write_table(table, legacy / "part-00000.parquet", use_deprecated_int96_timestamps=True)
    (root / "_SUCCESS").touch()
    (root / "_temporary").mkdir()
    (root / "_temporary" / "part-x.parquet").write_text("not Parquet: Spark never lists it")


def _jobs_while(spark: Any, group: str, build: Any) -> tuple[Any, list[int]]:
    context = spark.sparkContext
    context.setJobGroup(group, group)
    try:
        frame = build()
        frame.schema  # noqa: B018 - the schema is what is asked of the read
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return frame, list(context.statusTracker().getJobIdsForGroup(group))


def test_the_input_is_read_with_the_schema_sparks_inference_gives_without_its_job(
    spark: Any, tmp_path: Path
) -> None:
    """The driver reads the footer Spark's inference would read: the same
    schema (partition columns inferred from the paths as Spark does) and
    files, on files pyarrow wrote and on files Spark wrote (its schema in the
    footer), with no Spark job run for it."""
    from pyspark.sql import functions as F

    from shared.settings import ObjectStoreSettings
    from svc_score.parquet_input import read_parquet

    varied = tmp_path / "varied"
    _varied_store(varied)
    written = tmp_path / "by-spark"
    frame = spark.range(6).select(
        F.col("id"),
        F.current_timestamp().alias("at"),
        F.array(F.struct(F.lit("t").alias("topic"), F.col("id").alias("offset"))).alias("s"),
        (F.col("id") % 2).alias("part"),
    )
    frame.write.partitionBy("part").parquet(str(written))
    store = ObjectStoreSettings()
    for root in (varied, written):
        url = str(root)
        inferred, jobs_inferred = _jobs_while(
            spark, f"infer-{root.name}", lambda u=url: spark.read.parquet(u)
        )
        read, jobs_read = _jobs_while(
            spark, f"footer-{root.name}", lambda u=url: read_parquet(spark, u, store)
        )
        assert read.schema == inferred.schema
        assert sorted(read.inputFiles()) == sorted(inferred.inputFiles())
        assert (
            read.orderBy(*read.columns[:1]).collect()
            == inferred.orderBy(*read.columns[:1]).collect()
        )
        assert jobs_inferred and not jobs_read, (jobs_inferred, jobs_read)
    # Merging schemas is Spark's own job, over every footer.
    spark.conf.set("spark.sql.parquet.mergeSchema", "true")
    try:
        _, merged_jobs = _jobs_while(
            spark, "merged", lambda: read_parquet(spark, str(written), store)
        )
    finally:
        spark.conf.unset("spark.sql.parquet.mergeSchema")
    assert merged_jobs


def test_the_jobs_python_workers_keep_their_archives_directories(spark: Any) -> None:
    """Spark's Python workers run under shared.spark_daemon (the session's
    spark.python.daemon.module): a task's start reads none of the archives
    Spark puts on the workers' path (pyspark.zip, py4j, Spark's jar) again."""
    context = spark.sparkContext
    for archives, reads in context.parallelize([0, 1], 2).mapPartitions(_archive_reads).collect():
        assert any(Path(archive).name == "pyspark.zip" for archive in archives), archives
        assert reads == []


def _watch_collections(given: Iterator[int]) -> Iterator[int]:
    """In a Python worker: from now on, note each collection's generation.
    Each function here reads its whole input: a worker that leaves some
    unread is not reused."""
    import gc

    list(given)

    noted: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            noted.append(info["generation"])

    gc.callbacks.append(note)
    sys.aistack_collections = (note, noted)  # type: ignore[attr-defined]
    yield os.getpid()


def _collections_since(given: Iterator[int]) -> Iterator[tuple[int, list[int]]]:
    """In a Python worker: the generations noted since ``_watch_collections``,
    which stops noting (the module's later tests share these workers)."""
    import gc

    list(given)
    note, noted = getattr(sys, "aistack_collections", (None, [None]))
    if note in gc.callbacks:
        gc.callbacks.remove(note)
    yield os.getpid(), list(noted)


def test_a_reused_worker_collects_its_young_garbage_between_tasks(spark: Any) -> None:
    """Between two tasks a worker collects generations 0 and 1
    (shared.spark_daemon), not the whole heap as pyspark's daemon does."""
    context = spark.sparkContext
    watched = context.parallelize([0, 1], 2).mapPartitions(_watch_collections).collect()
    reported = dict(context.parallelize([0, 1], 2).mapPartitions(_collections_since).collect())
    assert sorted(reported) == sorted(watched), "the second job's tasks ran in other workers"
    for generations in reported.values():
        assert 1 in generations and 2 not in generations, generations


def _first_only(given: Iterable[int]) -> Iterator[int]:
    """Reads one element of its input: pyspark does not reuse the worker."""
    yield next(iter(given))


def _batches_faults(given: Iterator[int]) -> Iterator[tuple[int, int]]:
    """In a Python worker: ``memory_probe.batches_faults``."""
    list(given)
    yield os.getpid(), memory_probe.batches_faults()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's mallopt")
def test_the_jobs_python_workers_reuse_freed_memory_from_their_first_batch(spark: Any) -> None:
    """A Python worker keeps what a batch freed for the next one
    (shared.spark_daemon: shared.malloc.hold_freed_memory before it forks
    them), from the first batch of a worker just forked: glibc's default
    gave such a batch's blocks back to the kernel and faulted each page in
    again in every batch (a block's 512 pages, 12,288 a batch here)."""
    context = spark.sparkContext
    # Workers that read part of their input are not reused: the next job's
    # tasks run in workers forked afresh, with nothing freed before.
    context.parallelize(range(4), 2).mapPartitions(_first_only).collect()
    for pid, faults in context.parallelize([0, 1], 2).mapPartitions(_batches_faults).collect():
        # Eight batches' pages would be 98,304 faults; a tenth of one batch's is slack.
        assert faults < memory_probe.BATCH_PAGES // 10, (pid, faults)


def test_the_command_scores_on_a_standalone_cluster(
    registry: tuple[ScoreSettings, ms.ServerThread],
    digits_file: tuple[Path, np.ndarray],
    tmp_path: Path,
) -> None:
    """``aistack score`` with AISTACK_SPARK_MASTER naming a standalone master
    (and one worker) that this test starts from pyspark's own jars: the
    executors run on the worker, and the predictions are svc_model's."""
    settings, server = registry
    path, x = digits_file
    output = tmp_path / "scored"
    name = MODELS[ms.TF]
    with standalone_cluster(tmp_path / "cluster") as cluster:
        spark = cluster.settings()
        env = {
            **os.environ,
            "AISTACK_SPARK_MASTER": spark.master,
            "AISTACK_SPARK_CONF": json.dumps(spark.conf),
            "AISTACK_KAFKA_BOOTSTRAP": settings.kafka.bootstrap,
            "AISTACK_SCORE_MODELS_TOPIC": settings.models_topic,
            "AISTACK_SCORE_ARTIFACT_CACHE_DIR": str(tmp_path / "cache"),
            "AISTACK_STATE_DIR": str(tmp_path / "state"),
        }
        command = [sys.executable, "-m", "aistack.cli", "score", name]
        command += ["--input", str(path), "--output", str(output), "--columns", ",".join(COLUMNS)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        apps = cluster.applications()
    assert (
        done.stdout.strip().splitlines()[-1]
        == f"scored {ROWS} rows with {name} version 1 into {output}"
    )
    assert [app["name"] for app in apps] == ["aistack-score"]
    table = pq.read_table(output).to_pydict()
    order = np.argsort(table["entity_id"])
    got = np.asarray(table["probabilities"], dtype=np.float32)[order]
    np.testing.assert_allclose(got, served(server, name, x), rtol=1e-5, atol=1e-6)
