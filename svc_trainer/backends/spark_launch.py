"""What both frameworks' Spark launchers share (``task.options.launcher:
spark``): the trainer's SparkSession, the check that a barrier stage fits,
how a failed job is named, and what a task does first and last.

- The SparkSession is built from ``spec.spark`` (the trainer's
  ``AISTACK_SPARK_*``) by the first such trial and kept for the executor's
  life (a start costs seconds), replaced only when a trial brings other
  settings.
- A barrier stage needs a slot for every task at once: on a local master
  with fewer cores the trial is refused at once, not after Spark's minutes
  of retries.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.settings import SparkSettings
from shared.spark_session import session as spark_session
from svc_trainer.backends.spark_channel import RankFailure
from svc_trainer.plan import RunSpec, TrialError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APP_NAME = "aistack-trainer"
_ERROR_LINE = re.compile(r"^[\w.]+(Error|Exception): ")


class _Session:
    """The executor's SparkSession, replaced only when a trial brings other
    Spark settings."""

    def __init__(self) -> None:
        self._settings: SparkSettings | None = None
        self._session: SparkSession | None = None

    def get(self, settings: SparkSettings, work_dir: Path) -> SparkSession:
        if self._session is not None and self._settings == settings:
            return self._session
        self.stop()
        self._session = spark_session(settings, APP_NAME, work_dir=work_dir)
        self._settings = settings
        return self._session

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
        self._session = None
        self._settings = None


_SESSION = _Session()


def session_for(spec: RunSpec) -> SparkSession:
    """The session ``spec``'s trial runs on; TrialError when the trainer
    was given no Spark settings."""
    if spec.spark is None:
        raise TrialError(
            "launcher spark: this trainer was given no Spark settings", reason="invalid_params"
        )
    return _SESSION.get(spec.spark, Path(spec.spark_work_dir or Path.cwd() / "spark"))


def stop_session() -> None:
    """Stop the session the Spark trials of this process share, if any."""
    _SESSION.stop()


def fitted(spec: RunSpec, tasks: int, context: Any) -> RunSpec:
    """``spec`` for ``tasks`` barrier tasks on ``context``'s master: refused
    (TrialError) when a local master cannot run them at once; on a local
    master the tasks share this host's cores, one share each."""
    assert spec.spark is not None
    if not spec.spark.is_local():
        return spec
    if tasks > context.defaultParallelism:
        raise TrialError(
            f"launcher spark: world_size {tasks} but {spec.spark.master} runs "
            f"{context.defaultParallelism} tasks at once",
            reason="invalid_params",
        )
    if spec.threads == 0:
        return replace(spec, threads=max(1, (os.cpu_count() or 1) // tasks))
    return spec


def failure(reported: RankFailure | None, exc: Exception, what: str) -> Exception:
    """The trial's error for a failed Spark job: the first failure a task
    reported (a TrialError with its reason when it was one), else the job's
    own last error line."""
    if reported is not None and reported.reason:
        return TrialError(
            f"{what}: {reported.line()}",
            reason=reported.reason,
            retryable=reported.retryable,
            traceback=reported.traceback,
        )
    if reported is not None:
        return RuntimeError(f"{what}: {reported.line()}")
    lines = [line for line in str(exc).splitlines() if _ERROR_LINE.match(line)]
    said = lines[-1][:500] if lines else type(exc).__name__
    return RuntimeError(f"{what}: the job failed: {said}")


def exit_once_written() -> None:
    """Leave without the interpreter's teardown once the task's output is
    written: TorchDistributor's and TensorFlow's threads now and then abort
    a finished process there ("terminate called without an active
    exception")."""
    atexit.register(_exit_now)


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
