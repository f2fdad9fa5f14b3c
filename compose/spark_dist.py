"""Spark's Kafka connector and protobuf jars: from Maven Central once, cached.

``spark.jars`` then points at local files, so a job starts without network
(``spark.jars.packages`` would resolve through Ivy on every cold start).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from compose import maven
from shared.errors import ConfigError

# pyspark's version (pyproject.toml pins it); keep in step with compose/spark/pom.xml.
SPARK_VERSION = "4.0.0"
SCALA_BINARY_VERSION = "2.13"
POM = Path(__file__).resolve().parent / "spark" / "pom.xml"


def connectors_home(cache_dir: Path) -> Path:
    return cache_dir / f"spark-connectors_{SCALA_BINARY_VERSION}-{SPARK_VERSION}"


def is_fetched(cache_dir: Path) -> bool:
    return maven.is_fetched(connectors_home(cache_dir))


def ensure_connector_jars(cache_dir: Path) -> list[Path]:
    """The jars to put on ``spark.jars``, fetched first when missing."""
    home = maven.fetch_runtime(
        POM,
        connectors_home(cache_dir),
        expect="spark-sql-kafka-0-10_*.jar",
        what=f"Spark {SPARK_VERSION} Kafka and protobuf connectors",
    )
    return sorted((home / "libs").glob("*.jar"))


# svc_transform's JVM functions (protobuf in and out of Spark rows), compiled
# here against pyspark's own jars: no Spark artifacts to download.
FUNCTIONS_SOURCES = Path(__file__).resolve().parent.parent / "svc_transform" / "jvm"
DESCRIPTOR_SET = (
    Path(__file__).resolve().parent.parent / "shared" / "contracts" / "aistack_v1.binpb"
)


def pyspark_installed() -> bool:
    return importlib.util.find_spec("pyspark") is not None


def pyspark_jars() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ConfigError("pyspark is not installed: make setup (the transform extra)")
    return Path(spec.origin).parent / "jars"


def ensure_functions_jar(cache_dir: Path) -> Path:
    """Compile svc_transform's JVM functions with the contracts' descriptor set
    into a jar in the cache; rebuilt when a source or the contracts change."""
    if not DESCRIPTOR_SET.is_file():
        raise ConfigError(f"{DESCRIPTOR_SET} is missing: make proto")
    sources = sorted(FUNCTIONS_SOURCES.rglob("*.java"))
    digest = hashlib.sha256(SPARK_VERSION.encode())
    for path in [*sources, DESCRIPTOR_SET]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    jar = cache_dir / "aistack-spark-functions" / f"functions-{digest.hexdigest()[:16]}.jar"
    if jar.is_file():
        return jar
    javac, jar_tool = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar_tool is None:
        raise ConfigError("a JDK (javac, jar) is needed to build svc_transform's functions")
    protobuf = [p for p in ensure_connector_jars(cache_dir) if p.name.startswith("protobuf-java")]
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent) as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        classpath = os.pathsep.join([str(pyspark_jars() / "*"), *map(str, protobuf)])
        _run(
            [
                javac,
                "--release",
                "17",
                "-nowarn",
                "-cp",
                classpath,
                "-d",
                str(classes),
                *map(str, sources),
            ],
            "compile svc_transform's functions",
        )
        shutil.copy(DESCRIPTOR_SET, classes / DESCRIPTOR_SET.name)
        built = Path(tmp) / jar.name
        _run(
            [jar_tool, "cf", str(built), "-C", str(classes), "."],
            "package svc_transform's functions",
        )
        for old in jar.parent.glob("functions-*.jar"):
            old.unlink()
        built.rename(jar)
    return jar


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-8:]
        raise ConfigError(f"could not {what}: {' | '.join(tail)}")
