"""Which class archive a local broker's JVM is pointed at: the one built for
this Kafka, this JDK and these jars, or none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compose import kafka_class_archive, kafka_dist
from compose.local import LocalStack
from compose.settings import InfraSettings
from shared.settings import CommonSettings

pytestmark = pytest.mark.skipif(
    kafka_class_archive.shutil.which("java") is None, reason="no java on PATH"
)


def _libs(cache: Path) -> Path:
    libs = kafka_dist.kafka_home(cache) / "libs"
    libs.mkdir(parents=True)
    (libs / "kafka_2.13-3.9.1.jar").write_bytes(b"classes")
    return libs


def _stack(tmp_path: Path, cache: Path) -> LocalStack:
    return LocalStack(
        InfraSettings(common=CommonSettings(state_dir=tmp_path / "state", cache_dir=cache))
    )


def test_a_broker_maps_the_archive_only_where_one_was_built(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _libs(cache)
    assert kafka_class_archive.java_options(cache) == []
    assert _stack(tmp_path, cache).jvm_options == []

    archive = kafka_class_archive.archive_path(cache)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archived classes")
    option = f"-XX:SharedArchiveFile={archive}"
    assert kafka_class_archive.java_options(cache) == [option]
    assert _stack(tmp_path, cache).jvm_options == [option]


def test_changed_jars_name_another_archive(tmp_path: Path) -> None:
    # The JVM refuses an archive whose class path changed since the dump:
    # a reinstalled or upgraded jar must lead to a fresh build, not to it.
    cache = tmp_path / "cache"
    jar = _libs(cache) / "kafka_2.13-3.9.1.jar"
    before = kafka_class_archive.archive_path(cache)
    os.utime(jar, ns=(1, 1))
    touched = kafka_class_archive.archive_path(cache)
    assert touched != before
    (jar.parent / "extra.jar").write_bytes(b"more")
    assert kafka_class_archive.archive_path(cache) not in (before, touched)


def test_a_stack_told_its_options_uses_those(tmp_path: Path) -> None:
    # How the build itself starts its broker: dumping, not mapping.
    settings = InfraSettings(common=CommonSettings(state_dir=tmp_path, cache_dir=tmp_path))
    stack = LocalStack(settings, jvm_options=["-XX:ArchiveClassesAtExit=/x.jsa"])
    assert stack.jvm_options == ["-XX:ArchiveClassesAtExit=/x.jsa"]
