"""svc_transform's driver maps the class archive ``make setup`` built: a
driver started with ``-Xshare:on`` (which turns an archive the JVM cannot
use into a failed start) comes up with it and runs a query."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shared.settings import CommonSettings
from svc_transform import class_archive, jars

DRIVER = """
import sys
from pathlib import Path
from shared.settings import CommonSettings, SparkSettings
from svc_transform.spark import session

spark = session(
    SparkSettings(master="local[1]", conf={"spark.driver.extraJavaOptions": "-Xshare:on"}),
    "class-archive-test",
    cache_dir=CommonSettings().cache_dir,
    work_dir=Path(sys.argv[1]),
)
runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print("args:", " ".join(runtime.getInputArguments()))
print("rows:", spark.range(10).selectExpr("sum(id)").first()[0])
spark.stop()
"""


def test_the_driver_starts_with_the_archive_mapped(tmp_path: Path) -> None:
    cache = CommonSettings().cache_dir
    # Built by make setup: a no-op here, unless the cache was emptied since.
    archive = class_archive.ensure(cache, jars.ensure_functions_jar(cache))
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert f"-XX:SharedArchiveFile={archive}" in done.stdout
    assert "-Xshare:on" in done.stdout
    assert "rows: 45" in done.stdout


def test_a_driver_that_cannot_map_its_archive_fails_under_xshare_on(tmp_path: Path) -> None:
    # The check above means something: a corrupt archive under -Xshare:on
    # stops the JVM (without -Xshare:on, the default, it starts without it).
    bad = tmp_path / "bad.jsa"
    bad.write_bytes(b"not an archive" * 100)
    java = class_archive.java_executable()
    done = subprocess.run(
        [str(java), "-Xshare:on", f"-XX:SharedArchiveFile={bad}", "-version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "Unable to use shared archive" in done.stdout + done.stderr
    fallback = subprocess.run(
        [str(java), f"-XX:SharedArchiveFile={bad}", "-version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert fallback.returncode == 0
