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
- A training loop of the user's (``user_loop_on_spark``) runs in every rank
  the same way; rank 0 exports what it asked to export in its task and
  returns the files, which the driver unpacks into ``spec.export_dir``.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from svc_trainer.backends import spark_launch
from svc_trainer.backends.spark_channel import (
    DriverAddress,
    DriverChannel,
    ProgressServer,
    RankFailure,
    report_failure,
)
from svc_trainer.backends.torch.ddp import ddp_world_size, train_under_launcher
from svc_trainer.plan import Channel, DataSplits, RunResult, RunSpec, TrialError
from svc_trainer.user_code.packages import put_on_path


def ddp_on_spark(
    spec: RunSpec, data: DataSplits, channel: Channel, model: nn.Module
) -> tuple[RunResult, nn.Module]:
    """Train ``spec`` as ``ddp`` on Spark; returns rank 0's result and
    ``model`` holding rank 0's trained weights (on the CPU). TrialError when
    the trainer has no Spark settings or a local master has fewer cores than
    ranks; RuntimeError when a rank or the Spark job fails."""
    output = _distribute(spec, data, channel, _rank)
    result, weights = output
    model.cpu().load_state_dict(torch.load(io.BytesIO(weights), weights_only=True))
    return result, model


def user_loop_on_spark(spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
    """Run the user's training loop (``task.entrypoint``) as ``ddp`` on
    Spark; returns rank 0's result, its export unpacked into
    ``spec.export_dir``. Raises as ``ddp_on_spark``."""
    result, files = _distribute(spec, data, channel, _user_rank)
    if files:
        target = Path(spec.export_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(files), mode="r") as tar:
            tar.extractall(target, filter="data")
    return result  # type: ignore[no-any-return]


def _distribute(spec: RunSpec, data: DataSplits, channel: Channel, rank_fn: Any) -> Any:
    from pyspark.ml.torch.distributor import TorchDistributor

    context = spark_launch.session_for(spec).sparkContext
    world = ddp_world_size(spec)
    spec = spark_launch.fitted(spec, world, context)
    context.setJobDescription(f"aistack trial {spec.trial_id} (ddp, {world} ranks)")
    host = context.getConf().get("spark.driver.host") or "127.0.0.1"
    with ProgressServer(host, channel) as server:
        distributor = TorchDistributor(
            num_processes=world, local_mode=False, use_gpu=spec.device == "cuda"
        )
        try:
            output = distributor.run(rank_fn, spec, data, server.address)
        except Exception as exc:
            raise spark_launch.failure(server.failure, exc, "ddp on Spark") from exc
    if output is None:
        raise RuntimeError("ddp on Spark: rank 0 returned nothing")
    return output


def _rank(spec: RunSpec, data: DataSplits, driver: DriverAddress) -> tuple[RunResult, bytes] | None:
    """One rank, in the process torchrun started inside a Spark task; rank 0
    returns its result and weights (TorchDistributor hands them to the
    driver), the others None."""
    rank = int(os.environ["RANK"])
    result, model = _reporting(
        rank, driver, lambda channel: train_under_launcher(spec, data, channel), spec
    )
    spark_launch.exit_once_written()
    if rank != 0:
        return None
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buffer)
    return result, buffer.getvalue()


def _user_rank(
    spec: RunSpec, data: DataSplits, driver: DriverAddress
) -> tuple[RunResult, bytes] | None:
    """One rank of a user's loop; rank 0 exports in its task and returns its
    result and the exported files (a tar), the others None."""
    from svc_trainer.backends.torch import user_loop

    rank = int(os.environ["RANK"])
    outcome, request = _reporting(
        rank, driver, lambda channel: user_loop.under_launcher(spec, data, channel), spec
    )
    spark_launch.exit_once_written()
    if rank != 0:
        return None
    assert outcome is not None  # rank 0's
    with tempfile.TemporaryDirectory(prefix="aistack-export-") as scratch:
        result = user_loop.finish(replace(spec, export_dir=scratch), outcome, request)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path in sorted(Path(scratch).rglob("*")):
                tar.add(path, arcname=str(path.relative_to(scratch)), recursive=False)
    return result, buffer.getvalue()


def _reporting(rank: int, driver: DriverAddress, train: Any, spec: RunSpec) -> Any:
    """``train(channel)`` with the driver as rank 0's channel; a failure is
    reported to the driver (its reason, when a TrialError) before it raises."""
    channel = DriverChannel(driver)
    try:
        put_on_path(spec.code)  # a task's process: not the executor's path
        return train(channel)
    except Exception as exc:
        error = exc if isinstance(exc, TrialError) else None
        report_failure(
            driver,
            RankFailure(
                rank,
                type(exc).__name__,
                str(exc)[:2000],
                error.reason if error else "",
                error.retryable if error else False,
                error.traceback if error else "",
            ),
        )
        raise
    finally:
        channel.close()
