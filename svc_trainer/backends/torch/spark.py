"""A ``ddp`` trial's ranks as Spark barrier tasks, through Spark's
TorchDistributor (``task.options.launcher: spark``).

``ddp_on_spark`` runs ``ddp.ddp_world_size(spec)`` ranks, one barrier
task each (``TorchDistributor(local_mode=False)``, so ``local[N]`` and a
cluster take the same path: each task starts torchrun for one process, and
every rank trains through ``ddp.train_under_launcher``). The
SparkSession is built from ``spec.spark`` (the trainer's ``AISTACK_SPARK_*``)
by the first such trial and kept for the executor's life: a start costs
seconds.

- Rank 0 reports to the trial's channel through the driver
  (``spark_channel``: every epoch, and every stop check is answered by the
  channel, so prune and shutdown reach the ranks as under ``ddp``), writes a
  checkpoint every epoch into ``spec.checkpoint_dir`` and returns the result
  with its trained weights; the driver loads them into the trial's model,
  which the runner exports as for any torch trial.
- ``spec.checkpoint_dir`` is a path on the host that runs rank 0: a cluster
  of more than one host needs the trainer's state dir on storage every
  worker mounts at the same path. The executors need the trainer's Python
  environment (aistack and torch importable). Tested on ``local[2]`` and on
  a standalone master with one worker on the trainer's host.
- ``device: cuda`` asks TorchDistributor for GPUs (Spark's GPU scheduling,
  ``spark.task.resource.gpu.amount``, must be configured); any other device
  trains on the executors' CPUs.
- The data travel pickled with the tasks.
- A rank that fails raises RuntimeError naming the rank and its error
  (TrialError, with the rank's reason, for a trial error), as ``ddp`` does.
"""

from __future__ import annotations

import atexit
import io
import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from shared.settings import SparkSettings
from shared.spark_session import session as spark_session
from svc_trainer.backends.spark_channel import (
    DriverAddress,
    DriverChannel,
    ProgressServer,
    RankFailure,
    report_failure,
)
from svc_trainer.backends.torch.ddp import ddp_world_size, train_under_launcher
from svc_trainer.plan import Channel, DataSplits, RunResult, RunSpec, TrialError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APP_NAME = "aistack-trainer"
_ERROR_LINE = re.compile(r"^[\w.]+(Error|Exception): ")


def ddp_on_spark(
    spec: RunSpec, data: DataSplits, channel: Channel, model: nn.Sequential
) -> tuple[RunResult, nn.Sequential]:
    """Train ``spec`` as ``ddp`` on Spark; returns rank 0's result and
    ``model`` holding rank 0's trained weights (on the CPU). TrialError when
    the trainer has no Spark settings or a local master has fewer cores than
    ranks; RuntimeError when a rank or the Spark job fails."""
    from pyspark.ml.torch.distributor import TorchDistributor

    if spec.spark is None:
        raise TrialError(
            "launcher spark: this trainer was given no Spark settings", reason="invalid_params"
        )
    world = ddp_world_size(spec)
    session = _SESSION.get(spec.spark, Path(spec.spark_work_dir or Path.cwd() / "spark"))
    context = session.sparkContext
    if spec.spark.is_local():
        if world > context.defaultParallelism:
            # A barrier stage needs every rank's slot at once; Spark would
            # retry for minutes before giving up.
            raise TrialError(
                f"launcher spark: world_size {world} but {spec.spark.master} runs "
                f"{context.defaultParallelism} tasks at once",
                reason="invalid_params",
            )
        if spec.threads == 0:
            # The ranks share this host's cores, as ddp's do.
            spec = replace(spec, threads=max(1, (os.cpu_count() or 1) // world))
    context.setJobDescription(f"aistack trial {spec.trial_id} (ddp, {world} ranks)")
    host = context.getConf().get("spark.driver.host") or "127.0.0.1"
    with ProgressServer(host, channel) as server:
        distributor = TorchDistributor(
            num_processes=world, local_mode=False, use_gpu=spec.device == "cuda"
        )
        try:
            output = distributor.run(_rank, spec, data, server.address)
        except Exception as exc:
            raise _failure(server.failure, exc) from exc
    if output is None:
        raise RuntimeError("ddp on Spark: rank 0 returned nothing")
    result, weights = output
    model.cpu().load_state_dict(torch.load(io.BytesIO(weights), weights_only=True))
    return result, model


def _failure(reported: RankFailure | None, exc: Exception) -> Exception:
    if reported is not None and reported.reason:
        return TrialError(f"ddp on Spark: {reported.line()}", reason=reported.reason)
    if reported is not None:
        return RuntimeError(f"ddp on Spark: {reported.line()}")
    lines = [line for line in str(exc).splitlines() if _ERROR_LINE.match(line)]
    said = lines[-1][:500] if lines else type(exc).__name__
    return RuntimeError(f"ddp on Spark: the job failed: {said}")


def _rank(spec: RunSpec, data: DataSplits, driver: DriverAddress) -> tuple[RunResult, bytes] | None:
    """One rank, in the process torchrun started inside a Spark task; rank 0
    returns its result and weights (TorchDistributor hands them to the
    driver), the others None."""
    rank = int(os.environ["RANK"])
    channel = DriverChannel(driver)
    try:
        result, model = train_under_launcher(spec, data, channel)
    except Exception as exc:
        reason = exc.reason if isinstance(exc, TrialError) else ""
        report_failure(driver, RankFailure(rank, type(exc).__name__, str(exc)[:2000], reason))
        raise
    finally:
        channel.close()
    # TorchDistributor's script writes what this returns, then the
    # interpreter tears down, where gloo's threads now and then abort a
    # finished rank ("terminate called without an active exception"): once
    # the output is written, leave without the teardown.
    atexit.register(_exit_now)
    if rank != 0:
        return None
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buffer)
    return result, buffer.getvalue()


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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


def stop_session() -> None:
    """Stop the session the Spark trials of this process share, if any."""
    _SESSION.stop()
