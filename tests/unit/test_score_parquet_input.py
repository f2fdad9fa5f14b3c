"""Which file the scoring job's driver reads its input's schema from, as
Spark's inference picks it, and the session a scoring job starts."""

from __future__ import annotations

import pytest

from shared.settings import SparkSettings
from svc_score import app
from svc_score.parquet_input import schema_file, spark_leaf


@pytest.mark.parametrize(
    "relative",
    [
        "part-0.parquet",
        "date=2025-01-01/metric=t/part-0.parquet",
        "_batch=1/part-0.parquet",  # a partition directory may start with _
        "_metadata",
        "_common_metadata",
    ],
)
def test_spark_lists_data_files_partitions_and_summaries(relative: str) -> None:
    assert spark_leaf(relative)


@pytest.mark.parametrize(
    "relative",
    [
        "_SUCCESS",
        ".part-0.parquet.crc",
        "_temporary/0/part-0.parquet",
        "date=2025-01-01/.spark-staging/part-0.parquet",
        "part-0.parquet._COPYING_",
    ],
)
def test_spark_skips_hidden_files_and_directories_and_copies_in_flight(relative: str) -> None:
    assert not spark_leaf(relative)


def test_the_schema_comes_from_a_summary_first_then_the_first_data_file_by_path() -> None:
    data = ["file:/in/b=2/part-0.parquet", "file:/in/a=1/part-9.parquet"]
    assert schema_file(data) == "file:/in/a=1/part-9.parquet"
    assert schema_file([*data, "file:/in/_metadata"]) == "file:/in/_metadata"
    both = [*data, "file:/in/_metadata", "file:/in/_common_metadata"]
    assert schema_file(both) == "file:/in/_common_metadata"
    assert schema_file([]) is None


def test_a_job_that_feeds_no_row_through_the_driver_runs_its_jit_at_c1() -> None:
    local = SparkSettings(master="local[2]", conf={"spark.executor.memory": "2g"})
    c1 = app.driver_settings(local, rows_through_jvm=False)
    assert c1.conf == {"spark.driver.extraJavaOptions": app.C1_ONLY, "spark.executor.memory": "2g"}
    # Rows through the local JVM (--where, --publish): C2 reads them faster.
    assert app.driver_settings(local, rows_through_jvm=True) == local
    # On a cluster the rows pass through the executors' JVMs, never the driver's.
    cluster = SparkSettings(master="spark://master:7077")
    assert app.driver_settings(cluster, rows_through_jvm=True).conf == {
        "spark.driver.extraJavaOptions": app.C1_ONLY
    }
    # The user's own options win.
    own = SparkSettings(master="local[2]", conf={"spark.driver.extraJavaOptions": "-Xss4m"})
    assert app.driver_settings(own, rows_through_jvm=False).conf == own.conf
