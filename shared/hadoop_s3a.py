"""Hadoop's S3A connector and Spark's cloud committers (``s3a/pom.xml``):
the jars a Spark job puts on its classpath to read and write ``s3a://`` on
the object store (``shared.object_store.hadoop_options`` configures them).

Fetched from Maven Central once into the cache (``aistack infra fetch``,
which ``make setup`` runs), so that svc_transform's stream and svc_score's
batch both start without network. pyspark ships the rest of Hadoop
(hadoop-client-api/runtime 3.4.1): hadoop-aws of that version, the AWS SDK v2
modules it loads (not the SDK's 500 MB bundle) and spark-hadoop-cloud.
"""

from __future__ import annotations

from pathlib import Path

from shared import maven

#: pyspark's Hadoop, which hadoop-aws must match; keep in step with s3a/pom.xml.
HADOOP_VERSION = "3.4.1"
POM = Path(__file__).resolve().parent / "s3a" / "pom.xml"


def home(cache_dir: Path) -> Path:
    return cache_dir / f"hadoop-s3a-{HADOOP_VERSION}"


def ensure_jars(cache_dir: Path) -> list[Path]:
    """The jars, fetched first when missing. Raises ConfigError when Maven is
    missing and Unavailable when Maven Central cannot be reached."""
    fetched = maven.fetch_runtime(
        POM,
        home(cache_dir),
        expect="hadoop-aws-*.jar",
        what=f"Hadoop {HADOOP_VERSION}'s S3A connector and Spark's cloud committers",
    )
    return sorted((fetched / "libs").glob("*.jar"))
