"""The Kafka broker's jars: resolved from Maven Central once, cached per version."""

from __future__ import annotations

from pathlib import Path

from shared import maven

# Kafka 3.9 is the newest line that still serves every protocol version
# aiokafka (Faust's client) and librdkafka (confluent-kafka) use; 4.x removed
# old ones (KIP-896). Keep in step with compose/kafka/pom.xml.
KAFKA_VERSION = "3.9.1"
SCALA_BINARY_VERSION = "2.13"
POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"


def kafka_home(cache_dir: Path) -> Path:
    return cache_dir / f"kafka_{SCALA_BINARY_VERSION}-{KAFKA_VERSION}"


def classpath(cache_dir: Path) -> str:
    return str(kafka_home(cache_dir) / "libs" / "*")


def is_fetched(cache_dir: Path) -> bool:
    return maven.is_fetched(kafka_home(cache_dir), POM)


def ensure_kafka_jars(cache_dir: Path) -> Path:
    """Resolve the broker's jars into the cache (a no-op when already there).

    Raises ConfigError when Maven is missing and Unavailable when Maven
    Central cannot be reached.
    """
    return maven.fetch_runtime(
        POM, kafka_home(cache_dir), expect="kafka_*.jar", what=f"Kafka {KAFKA_VERSION} jars"
    )
