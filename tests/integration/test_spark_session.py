"""One process, several Spark sessions one after another, as the trainer
and the tests start them: each gets the driver its settings launch."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import FailedPrecondition
from shared.settings import CommonSettings, SparkSettings
from shared.spark_session import session
from svc_transform import functions, jars


def test_a_session_after_one_launched_without_its_jars_has_them_and_a_running_one_is_refused(
    tmp_path: Path,
) -> None:
    local = SparkSettings(master="local[1]", conf={"spark.ui.enabled": "false"})
    first = session(local, "without-jars", work_dir=tmp_path / "first")
    first.range(3).count()
    first.stop()

    cache = CommonSettings().cache_dir
    # pyspark keeps the first session's driver JVM for the process; this one
    # must not start on it, or its functions' classes are not there.
    with_jars = jars.session_jars(cache)
    second = session(local, "with-jars", work_dir=tmp_path / "second", jars=with_jars)
    try:
        functions.register(second)
        with pytest.raises(FailedPrecondition, match=r"spark\.jars: stop it first"):
            session(local, "without-jars-again", work_dir=tmp_path / "third")
        # The same settings join the running session.
        joined = session(local, "joined", work_dir=tmp_path / "second", jars=with_jars)
        assert joined.sparkContext is second.sparkContext
    finally:
        second.stop()
