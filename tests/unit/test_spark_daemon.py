"""shared.spark_daemon: a zip importer reads its archive's directory again
only when the archive changed."""

from __future__ import annotations

import importlib
import sys
import zipfile
import zipimport
from pathlib import Path

import pytest

from shared import spark_daemon


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A zip of one module on the path, imported (its importer has read it),
    with zipimport restored afterwards."""
    path = tmp_path / "code.zip"
    with zipfile.ZipFile(path, "w") as zipped:
        zipped.writestr("zipped_first.py", "VALUE = 1\n")
    monkeypatch.setattr(
        zipimport.zipimporter, "invalidate_caches", zipimport.zipimporter.invalidate_caches
    )
    monkeypatch.syspath_prepend(str(path))
    for name in ("zipped_first", "zipped_second"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert importlib.import_module("zipped_first").VALUE == 1
    return path


def directory_reads(monkeypatch: pytest.MonkeyPatch, archive: Path) -> list[str]:
    """The reads of ``archive``'s directory from now on."""
    reads: list[str] = []
    read = zipimport._read_directory  # type: ignore[attr-defined]

    def counted(path: str) -> object:
        if path == str(archive):
            reads.append(path)
        return read(path)

    monkeypatch.setattr(zipimport, "_read_directory", counted)
    return reads


def test_python_reads_an_unchanged_archive_again_on_every_invalidation(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the daemon is for: without it, each task's invalidate_caches
    reads every archive on the path again."""
    reads = directory_reads(monkeypatch, archive)
    importlib.invalidate_caches()
    importlib.invalidate_caches()
    assert reads == [str(archive), str(archive)]


def test_an_unchanged_archive_is_not_read_again(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark_daemon.keep_unchanged_archives()
    reads = directory_reads(monkeypatch, archive)
    importlib.invalidate_caches()
    importlib.invalidate_caches()
    assert reads == []


def test_a_changed_archive_is_read_again_and_its_new_modules_import(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark_daemon.keep_unchanged_archives()
    reads = directory_reads(monkeypatch, archive)
    with zipfile.ZipFile(archive, "a") as zipped:
        zipped.writestr("zipped_second.py", "VALUE = 2\n")
    importlib.invalidate_caches()
    assert reads == [str(archive)]
    assert importlib.import_module("zipped_second").VALUE == 2
    importlib.invalidate_caches()  # read once per change
    assert reads == [str(archive)]


def test_every_importer_of_a_changed_archive_sees_the_change(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package's modules come through an importer of its own on the same
    archive: after a change, each reads the new directory."""
    with zipfile.ZipFile(archive, "a") as zipped:
        zipped.writestr("zipped_package/__init__.py", "")
        zipped.writestr("zipped_package/first.py", "VALUE = 1\n")
    for name in ("zipped_package", "zipped_package.first", "zipped_package.second"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.invalidate_caches()
    assert importlib.import_module("zipped_package.first").VALUE == 1
    spark_daemon.keep_unchanged_archives()
    with zipfile.ZipFile(archive, "a") as zipped:
        zipped.writestr("zipped_package/second.py", "VALUE = 2\n")
    importlib.invalidate_caches()
    assert importlib.import_module("zipped_package.second").VALUE == 2


def test_after_a_task_a_worker_collects_its_young_garbage_not_the_whole_heap() -> None:
    """What pyspark's daemon calls as ``gc.collect()`` after each task
    collects generations 0 and 1: a cycle the task dropped goes, and the
    collection does not walk the long-lived heap (generation 2)."""
    import gc
    import types
    import weakref

    class Node:
        other: object = None

    daemon = types.SimpleNamespace(gc=gc)
    spark_daemon.collect_young_after_tasks(daemon)
    generations: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    first, second = Node(), Node()
    first.other, second.other = second, first
    dropped = weakref.ref(first)
    del first, second
    gc.callbacks.append(seen)
    try:
        daemon.gc.collect()
    finally:
        gc.callbacks.remove(seen)
    assert dropped() is None
    assert generations == [1]
