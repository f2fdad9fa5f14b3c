"""svc_transform's own build (svc_transform/jars.py) and the environment its
Spark session needs, without building or starting anything."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from shared import spark_session
from shared.errors import ConfigError
from svc_transform import jars


def _java_tree(root: Path, name: str) -> Path:
    """A source tree of one empty class, ``dev/<name>.java``, under *root*."""
    (root / "dev").mkdir(parents=True)
    (root / "dev" / f"{name}.java").write_text(f"class {name} {{}}")
    return root


def test_the_functions_jar_is_named_after_its_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = _java_tree(tmp_path / "jvm", "A")
    pom = sources / "pom.xml"
    pinned = "<properties><protobuf.version>4.36.2</protobuf.version></properties>"
    pom.write_text(f"<project>{pinned}</project>")
    descriptors = tmp_path / "aistack_v1.binpb"
    descriptors.write_bytes(b"\x0a\x00")
    monkeypatch.setattr(jars, "JVM_SOURCES", sources)
    monkeypatch.setattr(jars, "POM", pom)
    monkeypatch.setattr(jars, "DESCRIPTOR_SET", descriptors)
    first = jars.functions_digest()
    pom.write_text(f"<project><!-- connectors only -->{pinned}</project>")
    assert jars.functions_digest() == first  # the rest of the pom is not compiled in
    (sources / "dev" / "A.java").write_text("class A { int x; }")
    assert jars.functions_digest() != first
    changed = jars.functions_digest()
    descriptors.write_bytes(b"\x0a\x01")
    assert jars.functions_digest() != changed
    changed = jars.functions_digest()
    pom.write_text(f"<project>{pinned.replace('4.36.2', '4.37.0')}</project>")
    assert jars.functions_digest() != changed  # protoc's classes and their runtime


def test_protoc_is_named_for_the_machine_or_the_machine_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jars.platform, "system", lambda: "Linux")
    monkeypatch.setattr(jars.platform, "machine", lambda: "aarch64")
    assert jars.protoc_classifier() == "linux-aarch_64"
    monkeypatch.setattr(jars.platform, "machine", lambda: "riscv64")
    with pytest.raises(ConfigError, match="no protoc build on Maven Central for Linux riscv64"):
        jars.protoc_classifier()


def test_the_build_leaves_the_functions_out_without_pyspark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connector = tmp_path / "libs" / "spark-sql-kafka-0-10_2.13-4.0.0.jar"
    monkeypatch.setattr(jars, "ensure_connector_jars", lambda cache: [connector])
    monkeypatch.setattr(jars, "pyspark_installed", lambda: False)

    def compile_functions(cache: Path) -> Path:
        raise AssertionError("compiled without pyspark")

    monkeypatch.setattr(jars, "ensure_functions_jar", compile_functions)
    built = jars.build(tmp_path)
    assert built == jars.Built([connector], None)
    assert built.describe() == [
        f"spark {jars.SPARK_VERSION} connectors: 1 jars in {tmp_path / 'libs'}",
        "svc_transform functions: not built (pyspark is not installed)",
    ]


def test_the_pom_and_sources_live_with_the_service() -> None:
    service = Path(jars.__file__).parent
    assert jars.POM.is_file() and jars.POM.is_relative_to(service)
    assert any(jars.JVM_SOURCES.rglob("*.java"))


def test_a_local_master_gets_its_environment_without_overriding_the_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python/bin/python3")
    spark_session.export_local_spark_environment()
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert os.environ["PYSPARK_PYTHON"] == "/opt/python/bin/python3"
    monkeypatch.delenv("PYSPARK_PYTHON")
    spark_session.export_local_spark_environment()
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_the_driver_maps_the_class_archive_only_where_one_was_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from svc_transform import class_archive

    functions = tmp_path / "functions-0123.jar"
    user = {class_archive.DRIVER_JAVA_OPTIONS: "-Dfoo=1", "spark.executor.memory": "2g"}
    assert class_archive.session_conf(user, tmp_path, functions) == user
    archive = class_archive.archive_path(tmp_path, functions)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"an archive")
    conf = class_archive.session_conf(user, tmp_path, functions)
    assert conf == {
        class_archive.DRIVER_JAVA_OPTIONS: f"-Dfoo=1 -XX:SharedArchiveFile={archive}",
        "spark.executor.memory": "2g",
    }
    # Another functions jar (or Spark, or JDK) is another archive, and so is
    # another checkout's pyspark: the JVM maps one only under its class path.
    assert class_archive.archive_path(tmp_path, tmp_path / "functions-4567.jar") != archive
    monkeypatch.setattr(jars, "pyspark_jars", lambda: tmp_path / "other-venv" / "jars")
    assert class_archive.archive_path(tmp_path, functions) != archive
    assert class_archive.session_conf(user, tmp_path, functions) == user
    # The same path installed again: its jars' times changed, so did the archive.
    reinstalled = tmp_path / "other-venv" / "jars"
    reinstalled.mkdir(parents=True)
    (reinstalled / "spark-core.jar").write_bytes(b"classes")
    before = class_archive.archive_path(tmp_path, functions)
    os.utime(reinstalled / "spark-core.jar", ns=(1, 1))
    assert class_archive.archive_path(tmp_path, functions) != before
    monkeypatch.undo()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    assert class_archive.session_conf(user, tmp_path, functions) == user


def test_local_files_go_through_the_nio_filesystem_on_the_driver_class_path(
    tmp_path: Path,
) -> None:
    jar = tmp_path / "driver-0123.jar"
    assert jars.local_filesystem_conf(jar, {}, local=True) == {
        jars.DRIVER_CLASS_PATH: str(jar),
        "spark.hadoop.fs.file.impl": jars.NIO_LOCAL_FILESYSTEM,
    }
    # A class path the user gives is kept, ours after it.
    given = {jars.DRIVER_CLASS_PATH: f"/opt/a.jar{os.pathsep}/opt/b.jar"}
    assert jars.local_filesystem_conf(jar, given, local=True)[
        jars.DRIVER_CLASS_PATH
    ] == os.pathsep.join(["/opt/a.jar", "/opt/b.jar", str(jar)])
    # A local filesystem the user names is theirs; a cluster's executors
    # lack the jar. The driver's class path is the same either way (its
    # class archive maps only under the class path it was dumped with).
    for conf, local in (({"spark.hadoop.fs.file.impl": "my.Fs"}, True), ({}, False)):
        assert jars.local_filesystem_conf(jar, conf, local=local) == {
            jars.DRIVER_CLASS_PATH: str(jar)
        }


def test_the_driver_jar_is_named_by_its_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = _java_tree(tmp_path / "jvm_driver", "Fs")
    monkeypatch.setattr(jars, "DRIVER_SOURCES", sources)
    first = jars.driver_jar_path(tmp_path / "cache")
    assert first.parent == tmp_path / "cache" / "aistack-spark-functions"
    assert first.name.startswith("driver-") and first == jars.driver_jar_path(tmp_path / "cache")
    (sources / "dev" / "Fs.java").write_text("class Fs { int x; }")
    assert jars.driver_jar_path(tmp_path / "cache") != first


def test_a_failed_archive_build_names_the_python_error_not_the_jvm_stack_after_it() -> None:
    from svc_transform.class_archive import build_failure

    # What CI printed: the warm-up's traceback, then the JVM's shutdown log.
    stderr = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "svc_transform/class_archive.py", line 170, in warm_up',
            "    raise ConfigError(...)",
            "shared.errors.ConfigError: the warm-up query stopped: boom",
            "26/12/03 07:51:10 ERROR TaskSchedulerImpl: Exception in statusUpdate",
            "org.apache.spark.SparkException: Job 109 cancelled because SparkContext was shut down",
            "\tat org.apache.spark.util.Utils$.tryLogNonFatalError(Utils.scala:1300)",
        ]
    )
    assert build_failure(stderr) == "shared.errors.ConfigError: the warm-up query stopped: boom"
    # No traceback (the JVM died first): the last lines, on one line.
    assert build_failure("a\nb\nc") == "a | b | c"
