"""``aistack score`` with its input, output and artifact on a real
S3-compatible object store (S3Proxy over HTTP, signed requests) and a local
Spark reading ``s3a://``: the predictions are those of the same job on local
paths, the output appears whole under its ``_lineage.json`` marker, and an
output that exists is refused."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyarrow.fs import FSSpecHandler, PyFileSystem

from shared import hadoop_s3a
from shared.bus.topics import PREDICTIONS_BATCH, TOPICS_BY_NAME, ensure_topics
from shared.contracts.aistack.v1 import models_pb2, predictions_pb2
from shared.errors import InvalidArgument
from shared.object_store import filesystem
from shared.settings import CommonSettings, SparkSettings
from svc_score import job
from svc_score.output import Staged
from svc_score.publish import Publication
from tests.infra import Infra, read_topic
from tests.object_store import LocalObjectStore
from tests.unit.test_trainer_data import Window, write_store

pytestmark = pytest.mark.integration

ENTITIES = ("s-1", "s-2", "s-3")


@pytest.fixture(scope="module")
def spark(
    object_store: LocalObjectStore, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """The module's local Spark (2 cores), with S3A on the test store, as
    ``svc_score.app`` starts one for a URL."""
    from shared.spark_session import session

    started = session(
        SparkSettings(master="local[2]"),
        "aistack-tests-score-store",
        work_dir=tmp_path_factory.mktemp("spark-driver"),
        jars=hadoop_s3a.ensure_jars(CommonSettings().cache_dir),
        object_store=object_store.settings,
    )
    yield started
    started.stop()


@dataclass(frozen=True)
class Setup:
    local_store: Path
    store_url: str  # the same files on the bucket
    event: models_pb2.ModelReady  # its artifact local
    remote_event: models_pb2.ModelReady  # the same artifact on the bucket
    prefix: str  # this module's keys


@pytest.fixture(scope="module")
def setup(object_store: LocalObjectStore, tmp_path_factory: pytest.TempPathFactory) -> Setup:
    """An offline store whose batch 1 wrote two windows of each entity again
    (each scored once, as the latest batch's), and the trainer's model,
    both locally and copied to the bucket."""
    from bench.batch_scoring import export_model

    tmp = tmp_path_factory.mktemp("score-store")
    event = export_model(tmp / "model")
    first = [
        Window(e, i, 10.0 * n + i, stddev=1.0) for n, e in enumerate(ENTITIES) for i in range(6)
    ]
    again = [Window(e, i, 50.0 + i, stddev=2.0, batch=1) for e in ENTITIES for i in (4, 5)]
    write_store(tmp / "store", first + again)
    prefix = f"score-{uuid.uuid4().hex[:12]}"
    fs, root = filesystem(object_store.url(prefix), object_store.settings)
    fs.put(str(tmp / "store"), f"{root}/store", recursive=True)
    fs.put(str(tmp / "model"), f"{root}/model", recursive=True)
    remote_event = models_pb2.ModelReady()
    remote_event.CopyFrom(event)
    remote_event.artifact_uri = object_store.url(f"{prefix}/model")
    return Setup(tmp / "store", object_store.url(f"{prefix}/store"), event, remote_event, prefix)


def read_back(store: LocalObjectStore, url: str) -> tuple[dict[tuple[str, Any], float], Any]:
    """(prediction by (entity, window start), lineage) of an output on the bucket."""
    fs, path = filesystem(url, store.settings)
    table = pq.read_table(path, filesystem=PyFileSystem(FSSpecHandler(fs)))
    lineage = json.loads(fs.cat_file(f"{path}/{job.LINEAGE_FILE}"))
    return predictions(table), lineage


def predictions(table: Any) -> dict[tuple[str, Any], float]:
    keys = zip(table["entity_id"].to_pylist(), table["window_start"].to_pylist(), strict=True)
    found = dict(zip(keys, table["prediction"].to_pylist(), strict=True))
    assert len(found) == table.num_rows  # each window once
    return found


def test_a_store_on_the_bucket_is_scored_into_the_bucket_as_on_local_paths(
    spark: Any, object_store: LocalObjectStore, setup: Setup, tmp_path: Path
) -> None:
    settings = object_store.settings
    cache = tmp_path / "cache"
    local = job.score(
        spark,
        setup.event,
        input_path=str(setup.local_store),
        output=tmp_path / "local",
        cache_dir=cache,
        object_store=settings,
    )
    assert local.rows == len(ENTITIES) * 6
    output = object_store.url(f"{setup.prefix}/scored")
    remote = job.score(
        spark,
        setup.remote_event,
        input_path=setup.store_url,
        output=output,
        cache_dir=cache,
        object_store=settings,
    )
    assert remote.output == output and remote.rows == local.rows
    got, lineage = read_back(object_store, output)
    want = predictions(pq.read_table(tmp_path / "local"))
    assert got == pytest.approx(want, rel=1e-6)
    # Each window once, batch 1's where it wrote one again (as test_score.py checks locally).
    assert len(got) == len(ENTITIES) * 6
    assert lineage == remote.lineage
    assert lineage["rows"] == local.rows and lineage["input"] == setup.store_url
    assert lineage["artifact_uri"] == setup.remote_event.artifact_uri
    # Every Parquet object of the output named, with its rows and sources.
    fs, root = filesystem(object_store.url(setup.prefix), settings)
    written = sorted(p.rsplit("/", 1)[1] for p in fs.find(f"{root}/scored"))
    assert written == sorted([*lineage["files"], job.LINEAGE_FILE])
    assert sum(entry["rows"] for entry in lineage["files"].values()) == local.rows
    assert [entry for _, entry in sorted(lineage["files"].items())] == [
        entry for _, entry in sorted(local.lineage["files"].items())
    ]
    # The input's fingerprint: its objects' sizes and ETags, s3:// or s3a://.
    objects = [f"s3a://{p}" for p in fs.find(f"{root}/store") if p.endswith(".parquet")]
    assert lineage["input_digest"] == job.input_digest(objects, settings)
    assert lineage["input_files"] == len(objects)
    # Nothing staged is left beside the output.
    assert [p for p in fs.find(root) if ".partial" in p] == []

    # An output that exists is refused, and left as it was.
    before = fs.find(f"{root}/scored", detail=True)
    with pytest.raises(InvalidArgument, match="exists; scoring writes a new directory"):
        job.score(
            spark,
            setup.remote_event,
            input_path=setup.store_url,
            output=output,
            cache_dir=cache,
            object_store=settings,
        )
    fs.invalidate_cache()
    assert fs.find(f"{root}/scored", detail=True).keys() == before.keys()

    # With --where Spark reads the bucket as s3a:// and the tasks write through s3fs.
    where = "entity_id = 's-2'"
    filtered = job.score(
        spark,
        setup.event,
        input_path=object_store.url(f"{setup.prefix}/store", "s3a"),
        output=object_store.url(f"{setup.prefix}/where", "s3a"),
        cache_dir=cache,
        where=where,
        object_store=settings,
    )
    got, lineage = read_back(object_store, object_store.url(f"{setup.prefix}/where"))
    assert filtered.rows == lineage["rows"] == 6
    assert got == pytest.approx({k: v for k, v in want.items() if k[0] == "s-2"}, rel=1e-5)


def test_published_predictions_are_read_back_from_the_bucket(
    spark: Any, object_store: LocalObjectStore, setup: Setup, infra: Infra, tmp_path: Path
) -> None:
    topic = f"score-predictions-{uuid.uuid4().hex[:8]}"
    ensure_topics(infra.kafka, [TOPICS_BY_NAME[PREDICTIONS_BATCH].named(topic)])
    output = object_store.url(f"{setup.prefix}/published")
    scored = job.score(
        spark,
        setup.event,
        input_path=setup.store_url,
        output=output,
        cache_dir=tmp_path / "cache",
        publish_to=Publication(infra.kafka, topic),
        object_store=object_store.settings,
    )
    rows = len(ENTITIES) * 6
    _, lineage = read_back(object_store, output)
    assert lineage["published"] == {"topic": topic, "records": rows}
    values = read_topic(infra.kafka, topic, wanted=rows + 1, timeout=10)
    records = [predictions_pb2.BatchPrediction.FromString(value) for value in values]
    assert len(records) == rows
    assert {record.run_id for record in records} == {scored.lineage["run_id"]}


def test_a_commit_that_fails_leaves_no_output(
    object_store: LocalObjectStore, setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = object_store.settings
    output = object_store.url(f"{setup.prefix}/failed")
    staged = Staged(output, settings)
    staged.refuse_existing()
    fs, root = filesystem(object_store.url(setup.prefix), settings)
    for i in range(3):
        fs.pipe_file(f"{staged.staging.partition('://')[2]}/part-{i}.parquet", b"x")
    assert staged.parquet_files() == [f"part-{i}.parquet" for i in range(3)]
    copies = 0
    copy = staged._fs.copy

    def fails_third(source: str, target: str) -> None:
        nonlocal copies
        copies += 1
        if copies == 3:
            raise PermissionError("denied")
        copy(source, target)

    monkeypatch.setattr(staged._fs, "copy", fails_third)
    with pytest.raises(PermissionError):
        staged.commit({"rows": 0})
    staged.discard()
    fs.invalidate_cache()
    assert not fs.exists(f"{root}/failed")
    assert [p for p in fs.find(root) if "/failed" in p] == []
