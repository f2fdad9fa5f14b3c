"""The jars svc_transform's Spark session loads: Spark's Kafka connector and
protobuf-java (fetched from Maven Central once, with protoc), Hadoop's S3A
connector with Spark's cloud committers (``shared.hadoop_s3a``), svc_transform's
own JVM functions (``jvm/`` with the contracts' Java classes protoc generates,
compiled once) and the classes its driver needs on the
class path it starts with (``jvm_driver/``: Hadoop's local filesystem without
a process per file, ``local_filesystem_conf``), all in the cache directory.

``spark.jars`` then points at local files, so a job starts without network
(``spark.jars.packages`` would resolve through Ivy on every cold start).
``python -m svc_transform.jars`` builds them ahead of time; ``aistack infra
fetch`` (``make setup``) and the container image run it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shared import hadoop_s3a, maven
from shared.errors import AistackError, ConfigError
from shared.settings import CommonSettings, load_settings

# pyspark's version (pyproject.toml pins it); keep in step with jvm/pom.xml.
SPARK_VERSION = "4.0.0"
SCALA_BINARY_VERSION = "2.13"
JVM_SOURCES = Path(__file__).resolve().parent / "jvm"
#: Classes the driver's JVM must find before any jar of ``spark.jars`` is
#: added (Hadoop loads the local filesystem as the JVM starts); they may use
#: only Spark's and Hadoop's own classes.
DRIVER_SOURCES = Path(__file__).resolve().parent / "jvm_driver"
#: Hadoop's local filesystem that sets permissions and reads links through
#: java.nio (``jvm_driver/``); Hadoop's own runs chmod or readlink for each.
NIO_LOCAL_FILESYSTEM = "dev.aistack.hadoop.NioLocalFileSystem"
POM = JVM_SOURCES / "pom.xml"
DESCRIPTOR_SET = (
    Path(__file__).resolve().parent.parent / "shared" / "contracts" / "aistack_v1.binpb"
)
#: The contracts' files (in ``DESCRIPTOR_SET``) whose Java classes the
#: functions use, with the one they import.
CONTRACT_FILES = ("aistack/v1/common.proto", "aistack/v1/events.proto", "aistack/v1/features.proto")
#: protoc's builds on Maven Central, by ``platform.system()`` and ``machine()``.
PROTOC_CLASSIFIERS = {
    ("Linux", "x86_64"): "linux-x86_64",
    ("Linux", "aarch64"): "linux-aarch_64",
    ("Darwin", "x86_64"): "osx-x86_64",
    ("Darwin", "arm64"): "osx-aarch_64",
}


@dataclass(frozen=True)
class Built:
    """What ``build`` left in the cache."""

    connectors: list[Path]
    # None where pyspark is not installed: the functions compile against its jars.
    functions: Path | None
    # The driver JVM's class archive (svc_transform.class_archive); None as functions.
    class_archive: Path | None = None
    # The jar on the driver's class path (``DRIVER_SOURCES``); None as functions.
    driver: Path | None = None

    def describe(self) -> list[str]:
        """One line per part, for a person."""
        lines = [
            f"spark {SPARK_VERSION} connectors: {len(self.connectors)} jars in "
            f"{self.connectors[0].parent}"
        ]
        if self.functions is not None:
            lines.append(f"svc_transform functions: {self.functions}")
        else:
            lines.append("svc_transform functions: not built (pyspark is not installed)")
        if self.driver is not None:
            lines.append(f"svc_transform driver classes: {self.driver}")
        if self.class_archive is not None:
            lines.append(f"svc_transform driver class archive: {self.class_archive}")
        return lines


def build(cache_dir: Path) -> Built:
    """Fetch the connectors and, where pyspark is installed, compile the
    functions and build the driver's class archive; each a no-op when already
    in the cache."""
    from svc_transform import class_archive

    connectors = ensure_connector_jars(cache_dir)
    if not pyspark_installed():
        return Built(connectors, None)
    functions = ensure_functions_jar(cache_dir)
    driver = ensure_driver_jar(cache_dir)
    return Built(connectors, functions, class_archive.ensure(cache_dir, functions), driver)


def session_jars(cache_dir: Path) -> list[Path]:
    """Every jar for ``spark.jars``, built first when missing."""
    return [
        *ensure_connector_jars(cache_dir),
        *hadoop_s3a.ensure_jars(cache_dir),
        ensure_functions_jar(cache_dir),
    ]


def connectors_home(cache_dir: Path) -> Path:
    return cache_dir / f"spark-connectors_{SCALA_BINARY_VERSION}-{SPARK_VERSION}"


def protoc_classifier() -> str:
    """The name of this machine's protoc build on Maven Central."""
    system, machine = platform.system(), platform.machine()
    try:
        return PROTOC_CLASSIFIERS[system, machine]
    except KeyError:
        raise ConfigError(
            f"no protoc build on Maven Central for {system} {machine}: svc_transform's "
            "functions are built on Linux or macOS, x86-64 or ARM64"
        ) from None


def is_fetched(cache_dir: Path) -> bool:
    return maven.is_fetched(connectors_home(cache_dir), POM, _connector_properties())


def _connector_properties() -> dict[str, str]:
    return {"protoc.classifier": protoc_classifier()}


def _connectors_libs(cache_dir: Path) -> Path:
    home = maven.fetch_runtime(
        POM,
        connectors_home(cache_dir),
        expect="spark-sql-kafka-0-10_*.jar",
        what=f"Spark {SPARK_VERSION} Kafka and protobuf connectors",
        properties=_connector_properties(),
    )
    return home / "libs"


def ensure_connector_jars(cache_dir: Path) -> list[Path]:
    """The connector jars, fetched first when missing."""
    return sorted(_connectors_libs(cache_dir).glob("*.jar"))


def _protoc(libs: Path) -> Path:
    """protoc of the connectors' protobuf-java version, fetched with them."""
    found = sorted(libs.glob("protoc-*.exe"))
    if not found:
        raise ConfigError(f"no protoc in {libs}: delete {libs.parent} to fetch it again")
    found[0].chmod(0o755)  # Maven copies it as a file, not a program
    return found[0]


def protobuf_version() -> str:
    """protobuf-java's and protoc's version, as the pom pins it."""
    found = re.search(r"<protobuf\.version>([^<]+)</protobuf\.version>", POM.read_text())
    if found is None:
        raise ConfigError(f"{POM} pins no protobuf.version")
    return found.group(1)


def pyspark_installed() -> bool:
    return importlib.util.find_spec("pyspark") is not None


def pyspark_jars() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ConfigError("pyspark is not installed: make setup (the transform extra)")
    return Path(spec.origin).parent / "jars"


def functions_digest() -> str:
    """Names the functions jar: it changes with Spark's version, protobuf's,
    any JVM source or the contracts' descriptor set, and nothing else."""
    if not DESCRIPTOR_SET.is_file():
        raise ConfigError(f"{DESCRIPTOR_SET} is missing: make proto")
    return _sources_digest(JVM_SOURCES, DESCRIPTOR_SET, pins=f"protobuf {protobuf_version()}")


def ensure_functions_jar(cache_dir: Path) -> Path:
    """Compile the JVM functions with the Java classes protoc generates from
    the contracts' descriptor set into a jar in the cache, against pyspark's
    own jars (no Spark artifacts to download); rebuilt when a source, protobuf
    or the contracts change."""
    jar = cache_dir / "aistack-spark-functions" / f"functions-{functions_digest()}.jar"
    if jar.is_file():
        return jar
    libs = _connectors_libs(cache_dir)
    with tempfile.TemporaryDirectory() as generated:
        _run(
            [
                str(_protoc(libs)),
                f"--descriptor_set_in={DESCRIPTOR_SET}",
                f"--java_out={generated}",
                *CONTRACT_FILES,
            ],
            "generate the contracts' Java classes",
        )
        sources = [*_java_sources(JVM_SOURCES), *_java_sources(Path(generated))]
        protobuf = sorted(libs.glob("protobuf-java-*.jar"))
        _compile_jar(jar, sources, protobuf, "svc_transform's functions")
    return jar


def driver_jar_path(cache_dir: Path) -> Path:
    """Where the driver class path's jar for these sources and this Spark lives."""
    digest = _sources_digest(DRIVER_SOURCES)
    return cache_dir / "aistack-spark-functions" / f"driver-{digest}.jar"


def ensure_driver_jar(cache_dir: Path) -> Path:
    """Compile ``DRIVER_SOURCES`` into a jar against pyspark's own jars;
    rebuilt when a source changes."""
    jar = driver_jar_path(cache_dir)
    if not jar.is_file():
        _compile_jar(jar, _java_sources(DRIVER_SOURCES), [], "svc_transform's driver classes")
    return jar


#: Spark's setting for the driver JVM's class path at launch.
DRIVER_CLASS_PATH = "spark.driver.extraClassPath"


def local_filesystem_conf(
    driver_jar: Path, conf: Mapping[str, str], *, local: bool
) -> dict[str, str]:
    """Spark settings for ``file:`` paths through ``NIO_LOCAL_FILESYSTEM``
    on a ``local`` master, whose tasks run in the driver (a cluster's
    executors would not find the class). The jar goes on the driver's class
    path ``conf`` names on any master, so that the driver's class archive,
    dumped under one class path, maps under the same. Without Hadoop's
    native library (pip's pyspark has none) its own local filesystem starts
    a chmod for every file and directory it creates and a readlink for every
    link status asked: at 1,000 events/s svc_transform's JVM started 38
    processes a second for its checkpoints, state and Parquet files.
    ``conf`` naming another ``fs.file.impl`` keeps it."""
    class_path = [p for p in conf.get(DRIVER_CLASS_PATH, "").split(os.pathsep) if p]
    found = {DRIVER_CLASS_PATH: os.pathsep.join([*class_path, str(driver_jar)])}
    if local and "spark.hadoop.fs.file.impl" not in conf:
        found["spark.hadoop.fs.file.impl"] = NIO_LOCAL_FILESYSTEM
    return found


def _java_sources(root: Path) -> list[Path]:
    return sorted(root.rglob("*.java"))


def _sources_digest(root: Path, *extra: Path, pins: str = "") -> str:
    """Spark's version, ``pins``, every Java source under ``root`` and ``extra``."""
    digest = hashlib.sha256(f"{SPARK_VERSION}{pins}".encode())
    for path in [*_java_sources(root), *extra]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _compile_jar(jar: Path, sources: list[Path], class_path: list[Path], what: str) -> None:
    """``jar`` from the Java ``sources``, compiled against pyspark's jars and
    ``class_path``."""
    javac, jar_tool = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar_tool is None:
        raise ConfigError(f"a JDK (javac, jar) is needed to build {what}")
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent) as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        compile_path = os.pathsep.join([str(pyspark_jars() / "*"), *map(str, class_path)])
        _run(
            [
                javac,
                "--release",
                "17",
                "-nowarn",
                "-cp",
                compile_path,
                "-d",
                str(classes),
                *map(str, sources),
            ],
            f"compile {what}",
        )
        built = Path(tmp) / jar.name
        _run([jar_tool, "cf", str(built), "-C", str(classes), "."], f"package {what}")
        prefix = jar.name.split("-", 1)[0]
        for old in jar.parent.glob(f"{prefix}-*.jar"):
            old.unlink()
        built.rename(jar)


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-8:]
        raise ConfigError(f"could not {what}: {' | '.join(tail)}")


def main() -> int:
    try:
        built = build(load_settings(CommonSettings).cache_dir)
    except AistackError as exc:
        print(f"svc_transform.jars: {exc}", file=sys.stderr)
        return 1
    for line in built.describe():
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
