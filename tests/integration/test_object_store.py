"""Artifacts, checkpoints, shipped code and model loading on a real
S3-compatible object store (S3Proxy over HTTP, signed requests), and what
an outage of the store does: a write rides it out, or fails retryable with
the last whole checkpoint still named."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest

from shared import model_loading
from shared.artifacts import ArtifactStore, digest
from shared.contracts.aistack.v1 import models_pb2
from shared.errors import Unavailable
from shared.object_store import filesystem
from tests.object_store import LocalObjectStore

pytestmark = pytest.mark.integration


def _tree(root: Path, files: int = 3, size: int = 1000, seed: int = 0) -> Path:
    for i in range(files):
        path = root / ("nested" if i % 2 else ".") / f"part-{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(hashlib.sha256(f"{seed}-{i}".encode()).digest() * (size // 32 + 1))
    return root


def test_an_artifact_on_the_bucket_is_read_back_whole_and_verified(
    object_store: LocalObjectStore, unique: str, tmp_path: Path
) -> None:
    model = _tree(tmp_path / "model")
    sha, size = digest(model)
    store = ArtifactStore(object_store.url(f"{unique}/artifacts"), object_store.settings)
    uri = store.put_dir(model, "models/forecast/1")
    assert uri == object_store.url(f"{unique}/artifacts/models/forecast/1")
    # Written again (a retried upload): the same tree, not one nested in it.
    store.put_dir(model, "models/forecast/1")

    event = models_pb2.ModelReady(
        model_name="forecast", version="1", artifact_uri=uri, sha256=sha, size_bytes=size
    )
    fetched = model_loading.fetch(event, tmp_path / "cache", object_store.settings)
    assert digest(fetched) == (sha, size)
    assert sorted(p.relative_to(fetched).as_posix() for p in fetched.rglob("*.bin")) == sorted(
        p.relative_to(model).as_posix() for p in model.rglob("*.bin")
    )

    tampered = models_pb2.ModelReady()
    tampered.CopyFrom(event)
    tampered.sha256 = "0" * 64
    with pytest.raises(model_loading.ArtifactRejected, match="sha256"):
        model_loading.fetch(tampered, tmp_path / "other", object_store.settings)


def test_shipped_code_on_the_bucket_is_read_by_a_trial(
    object_store: LocalObjectStore, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aistack.studies import ship_code
    from svc_trainer.user_code import packages

    code = tmp_path / "code"
    code.mkdir()
    (code / "my_model.py").write_text("WIDTH = 3\n")
    # A trial's process has the trainer's settings as its environment.
    for name, value in object_store.env().items():
        monkeypatch.setenv(name, value)
    package = ship_code(code, object_store.url(f"{unique}/artifacts"))
    assert package.uri.startswith(object_store.url(unique))
    data = packages._read(package.uri)
    assert hashlib.sha256(data).hexdigest() == package.sha256


def test_a_checkpoint_on_the_bucket_is_one_whole_version_named_by_its_pointer(
    object_store: LocalObjectStore, unique: str, tmp_path: Path
) -> None:
    store = ArtifactStore(object_store.url(f"{unique}/artifacts"), object_store.settings)
    assert not store.get_checkpoint("checkpoints/trial", tmp_path / "none")
    for epoch in (1, 2):
        store.put_checkpoint(_tree(tmp_path / f"epoch-{epoch}", seed=epoch), "checkpoints/trial")
    read = tmp_path / "read"
    assert store.get_checkpoint("checkpoints/trial", read)
    assert digest(read) == digest(tmp_path / "epoch-2")

    url = object_store.url(f"{unique}/artifacts/checkpoints/trial")
    fs, path = filesystem(url, object_store.settings)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False, refresh=True))
    pointer = fs.cat_file(f"{path}/LATEST").decode()
    assert names == sorted(["LATEST", pointer]), "older versions are removed"


def test_a_checkpoint_replaced_while_it_is_read_is_read_whole(
    object_store: LocalObjectStore,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader's copy that a writer's next checkpoint overtakes (the old
    version removed file by file under it) is not taken for a checkpoint:
    the pointer has moved, and the newer version is read instead."""
    store = ArtifactStore(object_store.url(f"{unique}/artifacts"), object_store.settings)
    store.put_checkpoint(_tree(tmp_path / "old", seed=1), "checkpoints/trial")
    copy = store.get_dir
    overtaken: list[str] = []

    def overtaken_once(key: str, local: Path) -> bool:
        found = copy(key, local)
        if not overtaken:
            overtaken.append(key)
            # What the copy found of a version being removed: part of it.
            next(local.rglob("*.bin")).unlink()
            store.put_checkpoint(_tree(tmp_path / "new", seed=2), "checkpoints/trial")
        return found

    monkeypatch.setattr(store, "get_dir", overtaken_once)
    read = tmp_path / "read"
    assert store.get_checkpoint("checkpoints/trial", read)
    assert overtaken and digest(read) == digest(tmp_path / "new")


def test_an_outage_mid_upload_is_ridden_out_and_the_checkpoint_lands_whole(
    tmp_path: Path, unique: str
) -> None:
    """The server stops while a checkpoint's files are going up and starts
    again a moment later (its objects kept, as a real store's): the upload
    goes on and the pointer names the whole new version."""
    server = LocalObjectStore(tmp_path / "server")
    server.start()
    try:
        settings = server.settings.model_copy(update={"ride_out_s": 120.0})
        store = ArtifactStore(server.url(f"{unique}/artifacts"), settings)
        store.put_checkpoint(_tree(tmp_path / "old", seed=1), "checkpoints/trial")
        new = _tree(tmp_path / "new", files=40, size=2_000_000, seed=2)
        failures: list[BaseException] = []

        def upload() -> None:
            try:
                store.put_checkpoint(new, "checkpoints/trial")
            except BaseException as error:
                failures.append(error)

        uploading = threading.Thread(target=upload)
        uploading.start()
        _wait_for_a_new_version(server.server.data, unique)
        server.stop()
        time.sleep(2)
        server.start()
        uploading.join(timeout=180)
        assert not uploading.is_alive() and not failures, failures
        read = tmp_path / "read"
        assert store.get_checkpoint("checkpoints/trial", read)
        assert digest(read) == digest(new)
    finally:
        server.stop()


def test_a_store_away_too_long_fails_retryable_and_keeps_the_last_checkpoint(
    tmp_path: Path, unique: str
) -> None:
    server = LocalObjectStore(tmp_path / "server")
    server.start()
    try:
        settings = server.settings.model_copy(update={"ride_out_s": 1.0})
        store = ArtifactStore(server.url(f"{unique}/artifacts"), settings)
        old = _tree(tmp_path / "old", seed=1)
        store.put_checkpoint(old, "checkpoints/trial")
        server.stop()
        with pytest.raises(Unavailable, match=server.server.endpoint) as failed:
            store.put_checkpoint(_tree(tmp_path / "new", seed=2), "checkpoints/trial")
        assert failed.value.reason == "unavailable"  # retry with backoff
        assert "try again" in str(failed.value)
        server.start()
        read = tmp_path / "read"
        assert store.get_checkpoint("checkpoints/trial", read)
        assert digest(read) == digest(old)
    finally:
        server.stop()


def _wait_for_a_new_version(data: Path, unique: str) -> None:
    """Until the first object of a second checkpoint version is on disk."""
    checkpoint = data / "aistack" / unique / "artifacts" / "checkpoints" / "trial"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        versions = sorted(p for p in checkpoint.glob("v*") if p.is_dir())
        if len(versions) > 1 and any(versions[-1].rglob("*.bin")):
            return
        time.sleep(0.005)
    raise AssertionError("the new version's upload never started")


def test_tensorboard_shows_a_run_mirrored_to_the_bucket(
    object_store: LocalObjectStore, unique: str, tmp_path: Path
) -> None:
    """The trainer's TrialBoard writes locally and mirrors the run to the
    bucket each epoch (``Uploads`` with ``mirror_dir``, as the worker does);
    TensorBoard started as ``aistack dashboard`` starts it on an ``s3://``
    logdir lists it with its scalars."""
    import json
    import os
    import subprocess
    import sys
    import urllib.request

    from shared.object_store import boto3_env
    from shared.ports import free_ports
    from svc_trainer.background import Uploads
    from svc_trainer.tensorboard import TrialBoard

    logdir = object_store.url(f"{unique}/tensorboard")
    boards = ArtifactStore(logdir, object_store.settings)
    uploads = Uploads(boards, tmp_path / "uploads", put=boards.mirror_dir)
    board = TrialBoard(
        tmp_path / "runs" / "study" / "trial-0",
        "study/0",
        {"lr": 0.1},
        ("val_loss",),
        mirror=lambda run: uploads.submit(run, "study/trial-0"),
    )
    board.epoch(1, {"val_loss": 0.5})
    board.close()
    assert uploads.drain(60)
    uploads.close()

    (port,) = free_ports(1)
    flags = ["--host=127.0.0.1", f"--port={port}", "--load_fast=false", "--reload_interval=1"]
    server = subprocess.Popen(
        [sys.executable, "-m", "svc_trainer.tensorboard", f"--logdir={logdir}", *flags],
        env={**os.environ, **boto3_env(object_store.settings)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run=study/trial-0&tag=val_loss"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(base, timeout=5) as answer:
                    points = json.loads(answer.read())
                if points:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "TensorBoard never showed the run"
            time.sleep(0.5)
    finally:
        server.terminate()
        server.wait(timeout=30)
    [[_, step, value]] = points
    assert (step, value) == (1, 0.5)


def test_a_tree_is_moved_aside_on_the_bucket_markers_and_all(
    object_store: LocalObjectStore, unique: str
) -> None:
    """What a fresh event-time epoch does to svc_transform's checkpoint and
    offline store there: every object to the archive, none left behind,
    the directory markers S3A writes passed over."""
    from shared.object_store import move_tree

    fs, root = filesystem(object_store.url(unique), object_store.settings)
    for name in ("checkpoint/offsets/0", "checkpoint/commits/0", "checkpoint/metadata"):
        fs.pipe_file(f"{root}/{name}", name.encode())
    fs.pipe_file(f"{root}/checkpoint/sources/", b"")  # a directory marker
    assert move_tree(fs, f"{root}/checkpoint", f"{root}/epochs/1/checkpoint") == 3
    fs.invalidate_cache()
    assert not fs.find(f"{root}/checkpoint")
    assert fs.cat_file(f"{root}/epochs/1/checkpoint/offsets/0") == b"checkpoint/offsets/0"


def test_a_parquet_store_with_the_directory_markers_spark_leaves_is_read_back(
    object_store: LocalObjectStore, unique: str
) -> None:
    """S3A keeps an empty ``dir/`` object for a directory it made; s3fs lists
    it as a file, which pyarrow's discovery could not open (a killed and
    restarted svc_transform's offline store failed to read back in CI)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shared.offline_store import open_store

    fs, root = filesystem(object_store.url(f"{unique}/windows"), object_store.settings)
    partition = f"{root}/date=2026-11-22/metric=temperature/window=tumbling-10s"
    with fs.open(f"{partition}/part-0.parquet", "wb") as out:
        pq.write_table(pa.table({"mean": [1.5, 2.5]}), out)
    fs.pipe_file(f"{partition}/", b"")  # the marker
    fs.pipe_file(f"{root}/date=2026-11-22/", b"")
    fs.invalidate_cache()
    assert any(name.endswith("/") for name in fs.find(root, withdirs=True))

    table = open_store(object_store.url(f"{unique}/windows"), object_store.settings).to_table()
    assert sorted(table.column("mean").to_pylist()) == [1.5, 2.5]
    assert set(table.column("window").to_pylist()) == {"tumbling-10s"}
