"""A ``multi_worker_mirrored`` trial's workers as Spark barrier tasks
(``task.options.launcher: spark``), the way spark-tensorflow-distributor's
``MirroredStrategyRunner`` ran them: the trial's hosts are whichever Spark's
cluster manager gives, never a scheduler of ours.

``mwms_on_spark`` runs ``world`` barrier tasks (``world_size``, else 2; one
per GPU where there are GPUs). Each task picks a free port on its host; the
tasks exchange their addresses through the barrier (``allGather``), so
every task knows the cluster; and each starts a fresh Python process
(TensorFlow sets its collectives up once per process, and Spark reuses its
Python workers) with the ``TF_CONFIG`` naming its own task:
``python -m svc_trainer.backends.tensorflow.cluster spark-worker --job DIR``.
Every worker trains the same model on its shard, as a local
``multi_worker_mirrored`` trial's workers do (a loop of the user's runs in
each); worker 0 is the chief:

- it reports every epoch to the trial's channel through the driver
  (``spark_channel``: each stop check is answered by the channel, so a
  prune or a shutdown reaches every worker through the chief's all-reduce);
- it checkpoints into ``spec.checkpoint_dir``, a path on the host that runs
  it: a cluster of more than one host needs the trainer's state directory
  on storage every worker mounts at the same path (as ``torch.spark``'s);
- it exports the model and its task returns the files with the result,
  which the driver unpacks into ``spec.export_dir``.

A worker that fails reports why to the driver before it exits; the trial
fails with the first such report (a TrialError keeps its reason).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from svc_trainer.backends import spark_launch
from svc_trainer.backends.spark_channel import (
    DriverAddress,
    ProgressServer,
    RankFailure,
    report_failure,
)
from svc_trainer.backends.tensorflow.cluster import write_job
from svc_trainer.plan import Channel, DataSplits, RunResult, RunSpec, StopReason, TensorSig

WHAT = "multi_worker_mirrored on Spark"
_RESULT = "result.json"
_DRIVER = "driver.json"
_MODEL = "model"
_PACKAGE_ROOT = Path(__file__).resolve().parents[3]


def mwms_on_spark(spec: RunSpec, data: DataSplits, channel: Channel, world: int) -> RunResult:
    """Train ``spec`` as ``multi_worker_mirrored`` over ``world`` barrier
    tasks; the chief's result, its export unpacked into ``spec.export_dir``.
    TrialError when the trainer has no Spark settings or a local master has
    fewer cores than workers; RuntimeError when a worker or the job fails."""
    context = spark_launch.session_for(spec).sparkContext
    spec = spark_launch.fitted(spec, world, context)
    context.setJobDescription(f"aistack trial {spec.trial_id} (multi_worker_mirrored, {world})")
    host = context.getConf().get("spark.driver.host") or "127.0.0.1"
    # The tasks need no Spark: their spec travels without the settings.
    travelling = replace(spec, spark=None)
    with ProgressServer(host, channel) as server:
        address = server.address
        tasks = context.parallelize(range(world), world).barrier()
        try:
            outputs = tasks.mapPartitions(lambda _: _task(travelling, data, address)).collect()
        except Exception as exc:
            raise spark_launch.failure(server.failure, exc, WHAT) from exc
    if not outputs:
        raise RuntimeError(f"{WHAT}: the chief returned nothing")
    result_text, files = outputs[0]
    result = result_from_json(result_text)
    if files:
        target = Path(spec.export_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(files), mode="r") as tar:
            tar.extractall(target, filter="data")
    return result


def _task(spec: RunSpec, data: DataSplits, driver: DriverAddress) -> Iterator[tuple[str, bytes]]:
    """One barrier task: find the cluster, run this task's worker in a
    process of its own; the chief's task yields its result and files."""
    from pyspark import BarrierTaskContext

    from shared.ports import free_port

    context = BarrierTaskContext.get()
    index = context.partitionId()
    host = context.getTaskInfos()[index].address.rsplit(":", 1)[0]
    addresses = context.allGather(f"{host}:{free_port()}")
    tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    with tempfile.TemporaryDirectory(prefix=f"aistack-tf-{index}-") as scratch:
        job = Path(scratch)
        write_job(job, spec, data)
        (job / _DRIVER).write_text(json.dumps(asdict(driver)))
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config)}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p
        )
        command = [sys.executable, "-m", "svc_trainer.backends.tensorflow.cluster"]
        done = subprocess.run(
            [*command, "spark-worker", "--job", str(job)], env=env, stdin=subprocess.DEVNULL
        )
        if done.returncode != 0:
            raise RuntimeError(f"worker {index} exited with code {done.returncode}")
        if index != 0:
            return
        buffer = io.BytesIO()
        model = job / _MODEL
        if model.is_dir():
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                for path in sorted(model.rglob("*")):
                    tar.add(path, arcname=str(path.relative_to(model)), recursive=False)
        yield (job / _RESULT).read_text(), buffer.getvalue()


def work(job: Path, role: Any) -> None:
    """A worker's process (``cluster``'s ``spark-worker`` mode): train this
    task's part; the chief reports through the driver and exports into the
    job directory."""
    from svc_trainer.backends.spark_channel import DriverChannel
    from svc_trainer.backends.tensorflow import cluster, runner
    from svc_trainer.plan import SilentChannel, TrialError
    from svc_trainer.user_code.packages import put_on_path

    spec, data = cluster.read_job(job)
    driver = DriverAddress(**json.loads((job / _DRIVER).read_text()))
    channel: Any = DriverChannel(driver) if role.is_chief else SilentChannel()
    try:
        put_on_path(spec.code)
        scratch = job / f"checkpoints-{role.task_type}-{role.task_index}"
        result, trained = runner.train_in_cluster(spec, data, channel, role, scratch)
        if role.is_chief:
            result = runner.finish(
                replace(spec, export_dir=str(job / _MODEL)), data, result, trained
            )
            (job / _RESULT).write_text(result_to_json(result))
    except Exception as exc:
        error = exc if isinstance(exc, TrialError) else None
        failure = RankFailure(
            role.task_index,
            type(exc).__name__,
            str(exc)[:2000],
            error.reason if error else "",
            error.retryable if error else False,
            error.traceback if error else "",
        )
        report_failure(driver, failure)
        raise
    finally:
        if isinstance(channel, DriverChannel):
            channel.close()


def result_to_json(result: RunResult) -> str:
    document = asdict(result)
    document["stopped"] = int(result.stopped)
    return json.dumps(document)


def result_from_json(text: str) -> RunResult:
    document = json.loads(text)
    return RunResult(
        epochs_completed=int(document["epochs_completed"]),
        stopped=StopReason(int(document["stopped"])),
        val_metrics={str(k): float(v) for k, v in document["val_metrics"].items()},
        test_metrics={str(k): float(v) for k, v in document["test_metrics"].items()},
        export_format=str(document["export_format"]),
        inputs=tuple(_signature(d) for d in document["inputs"]),
        outputs=tuple(_signature(d) for d in document["outputs"]),
        replica_digests=tuple(document["replica_digests"]),
    )


def _signature(document: dict[str, Any]) -> TensorSig:
    return TensorSig(str(document["name"]), str(document["datatype"]), tuple(document["shape"]))
