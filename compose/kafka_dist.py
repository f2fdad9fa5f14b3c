"""The Kafka broker's jars: resolved from Maven Central once, cached per version."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from shared.errors import ConfigError, Unavailable

# Kafka 3.9 is the newest line that still serves every protocol version
# aiokafka (Faust's client) and librdkafka (confluent-kafka) use; 4.x removed
# old ones (KIP-896). Keep in step with compose/kafka/pom.xml.
KAFKA_VERSION = "3.9.1"
SCALA_BINARY_VERSION = "2.13"
POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"
_STAMP = ".complete"


def kafka_home(cache_dir: Path) -> Path:
    return cache_dir / f"kafka_{SCALA_BINARY_VERSION}-{KAFKA_VERSION}"


def classpath(cache_dir: Path) -> str:
    return str(kafka_home(cache_dir) / "libs" / "*")


def is_fetched(cache_dir: Path) -> bool:
    return (kafka_home(cache_dir) / _STAMP).is_file()


def ensure_kafka_jars(cache_dir: Path) -> Path:
    """Resolve the broker's jars into the cache (a no-op when already there).

    Raises ConfigError when Maven is missing and Unavailable when Maven
    Central cannot be reached.
    """
    home = kafka_home(cache_dir)
    if is_fetched(cache_dir):
        return home
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError("Maven (mvn) is needed once to fetch Kafka's jars: apt-get install maven")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        libs = Path(tmp) / "libs"
        result = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(POM),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={libs}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0 or not any(libs.glob("kafka_*.jar")):
            tail = (result.stdout + result.stderr).strip().splitlines()[-5:]
            raise Unavailable(f"could not fetch Kafka {KAFKA_VERSION} jars: {' | '.join(tail)}")
        if home.exists():
            shutil.rmtree(home)
        home.mkdir(parents=True)
        libs.rename(home / "libs")
    (home / _STAMP).write_text(KAFKA_VERSION + "\n")
    return home
