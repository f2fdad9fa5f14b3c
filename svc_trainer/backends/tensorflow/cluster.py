"""The processes of a multi-process TensorFlow strategy on this node.

A TensorFlow cluster is a ``TF_CONFIG``: the addresses of every task (the
``chief``, the ``worker``s, the ``ps``s) and which one a process is. The trial
process is the chief (``multi_worker_mirrored``: worker 0; ``parameter_server``:
the coordinator) and, when the trial names no cluster of its own, starts the
other tasks here as child processes on free localhost ports:

- ``python -m svc_trainer.backends.tensorflow.cluster worker --job DIR``: a MultiWorkerMirrored
  worker. It trains the same model on its shard of the data (``DIR`` holds the
  spec and the data, written by the chief) and reports nothing.
- ``python -m svc_trainer.backends.tensorflow.cluster server``: a ``tf.distribute.Server`` (a
  parameter server, or a worker the coordinator schedules steps on).

- ``python -m svc_trainer.backends.tensorflow.cluster spark-worker --job
  DIR``: a MultiWorkerMirrored worker in a Spark barrier task, on any host of
  the Spark cluster (``spark``: ``task.options.launcher: spark``); its chief
  reports through the driver and exports into ``DIR``.

All read their task from ``TF_CONFIG``. On the other hosts of a multi-node
parameter-server cluster (``spec.tf_config``), ``server`` runs a ps or
worker task as is; a MultiWorkerMirrored trial spans hosts as Spark barrier
tasks only (a trainer replica takes whole trials, so no other replica would
run the other workers). Children never outlive the chief: ``LocalCluster`` terminates them when
it closes, and each child exits by itself when its parent dies (``main``
calls ``lifetime.die_with_parent`` first: a SIGKILLed trial process runs no
cleanup).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from shared.log import configure_logging, get_logger
from shared.ports import free_ports
from svc_trainer.backends.launch import LocalGroup
from svc_trainer.lifetime import die_with_parent
from svc_trainer.plan import CodeRef, DataSplits, Hyperparams, RunSpec, TrialError

log = get_logger("svc_trainer")

# The chief waits this long for a child to exit on SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 5.0


@dataclass(frozen=True)
class Role:
    """This process's place in a TensorFlow cluster.

    ``cluster`` maps task types to "host:port" lists; empty for a
    single-process strategy. ``local``: the chief started the other tasks on
    this node itself (so they share its filesystem and its devices)."""

    cluster: Mapping[str, Sequence[str]] = field(default_factory=dict)
    task_type: str = ""
    task_index: int = 0
    local: bool = True

    @property
    def is_chief(self) -> bool:
        """The one task that reports, checkpoints and exports."""
        if not self.cluster or self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_index == 0 and "chief" not in self.cluster

    def tf_config(self) -> str:
        return json.dumps(
            {
                "cluster": {k: list(v) for k, v in self.cluster.items()},
                "task": {"type": self.task_type, "index": self.task_index},
            }
        )

    def for_task(self, task_type: str, task_index: int) -> Role:
        return Role(self.cluster, task_type, task_index, self.local)


def parse_tf_config(text: str) -> Role:
    """A Role from a TF_CONFIG JSON; a missing ``task`` means the chief (or
    worker 0 when the cluster has no chief). Raises TrialError when the JSON
    is not a TF_CONFIG."""
    try:
        config = json.loads(text)
        cluster = {str(k): [str(a) for a in v] for k, v in dict(config["cluster"]).items()}
        task = dict(config.get("task") or {})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TrialError(
            f"tf_config is not a TF_CONFIG JSON: {exc}", reason="invalid_params"
        ) from exc
    default_type = "chief" if "chief" in cluster else "worker"
    task_type = str(task.get("type", default_type))
    task_index = int(task.get("index", 0))
    if task_index >= len(cluster.get(task_type, ())):
        raise TrialError(
            f"tf_config task {task_type}:{task_index} is not in its cluster {sorted(cluster)}",
            reason="invalid_params",
        )
    return Role(cluster, task_type, task_index, local=False)


def local_multi_worker(workers: int) -> Role:
    """Worker 0 (this process) of ``workers`` workers on localhost."""
    addresses = [f"127.0.0.1:{p}" for p in free_ports(workers)]
    return Role({"worker": addresses}, "worker", 0, local=True)


def local_parameter_server(workers: int, ps: int) -> Role:
    """The chief (this process, the coordinator) of a localhost cluster of
    ``workers`` workers and ``ps`` parameter servers."""
    ports = [f"127.0.0.1:{p}" for p in free_ports(1 + workers + ps)]
    cluster = {"chief": ports[:1], "worker": ports[1 : 1 + workers], "ps": ports[1 + workers :]}
    return Role(cluster, "chief", 0, local=True)


# -- job files -------------------------------------------------------------------------

_ARRAYS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")


def write_job(directory: Path, spec: RunSpec, data: DataSplits) -> None:
    """The spec (JSON) and the data (.npz, no pickles) a worker trains on."""
    # A TensorFlow worker starts no Spark: its spec travels without the settings.
    spec_doc = asdict(replace(spec, spark=None))
    spec_doc["options"] = dict(spec.options)
    data_doc = {f.name: getattr(data, f.name) for f in fields(data) if f.name not in _ARRAYS}
    data_doc["offsets"] = [list(o) for o in data.offsets]
    (directory / "job.json").write_text(json.dumps({"spec": spec_doc, "data": data_doc}))
    np.savez(directory / "data.npz", **{name: getattr(data, name) for name in _ARRAYS})


def read_job(directory: Path) -> tuple[RunSpec, DataSplits]:
    doc = json.loads((directory / "job.json").read_text())
    spec_doc = dict(doc["spec"])
    spec_doc["hparams"] = Hyperparams(**spec_doc["hparams"])
    spec_doc["code"] = CodeRef(**spec_doc["code"]) if spec_doc.get("code") else None
    data_doc = dict(doc["data"])
    data_doc["offsets"] = tuple(tuple(o) for o in data_doc["offsets"])
    for name in ("files", "feature_names", "class_names"):  # JSON has lists only
        data_doc[name] = tuple(data_doc.get(name, ()))
    with np.load(directory / "data.npz", allow_pickle=False) as arrays:
        loaded = {name: arrays[name] for name in _ARRAYS}
    return RunSpec(**spec_doc), DataSplits(**data_doc, **loaded)


# -- child processes -------------------------------------------------------------------


class LocalCluster:
    """The child tasks of a localhost cluster, started and reaped by a
    ``launch.LocalGroup``; a context manager that always reaps them and
    removes the job directory."""

    def __init__(self, role: Role, trial_id: str) -> None:
        self.role = role
        self._trial_id = trial_id
        self._group = LocalGroup(trial_id, grace_s=TERMINATE_GRACE_S)
        self._job_dir: Path | None = None

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start_workers(self, spec: RunSpec, data: DataSplits) -> None:
        """Start every worker but this process's (MultiWorkerMirrored)."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self._trial_id)
        self._job_dir = Path(tempfile.mkdtemp(prefix=f"tf-job-{safe}-"))
        write_job(self._job_dir, spec, data)
        for index in range(len(self.role.cluster.get("worker", ()))):
            if (self.role.task_type, self.role.task_index) != ("worker", index):
                self._start("worker", index, ["worker", "--job", str(self._job_dir)])

    def start_servers(self) -> None:
        """Start a server for every ps and worker task (ParameterServer)."""
        for task_type in ("ps", "worker"):
            for index in range(len(self.role.cluster.get(task_type, ()))):
                self._start(task_type, index, ["server"])

    def _start(self, task_type: str, index: int, args: list[str]) -> None:
        # The child's environment is ours plus its TF_CONFIG: it is a standard TF task.
        env = {"TF_CONFIG": self.role.for_task(task_type, index).tf_config()}
        self._group.start_module(
            f"{task_type}:{index}", "svc_trainer.backends.tensorflow.cluster", args, env
        )

    def watch(self, on_failure: Callable[[str, int], None]) -> None:
        """Call ``on_failure(task, exit code)`` (once, from a thread) when a
        child dies with an error before ``close``: a synchronous strategy's
        collectives would otherwise wait for it forever."""
        self._group.watch(on_failure)

    @property
    def pids(self) -> list[int]:
        return self._group.pids

    def failed(self) -> list[tuple[str, int]]:
        """Children that exited with an error, with their exit codes."""
        return self._group.failed()

    def wait(self, timeout: float) -> bool:
        """Wait for every child to exit on its own; whether they all did."""
        return self._group.wait(timeout)

    def close(self) -> None:
        self._group.close()
        if self._job_dir is not None:
            shutil.rmtree(self._job_dir, ignore_errors=True)
            self._job_dir = None


def _serve() -> None:
    import tensorflow as tf

    resolver: Any = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type == "ps":
        # Parameter servers only hold variables: leave the GPUs to the workers.
        tf.config.set_visible_devices([], "GPU")
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    log.info("tf_cluster.serving", task=f"{resolver.task_type}:{resolver.task_id}")
    server.join()


def _role(*, local: bool) -> Role:
    """This process's task, from its TF_CONFIG."""
    import tensorflow as tf

    resolver: Any = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = {k: list(v) for k, v in resolver.cluster_spec().as_dict().items()}
    return Role(cluster, str(resolver.task_type), int(resolver.task_id), local=local)


def _work(job: Path) -> None:
    from svc_trainer.backends.tensorflow import runner as tf_runner
    from svc_trainer.user_code.packages import put_on_path

    role = _role(local=True)
    spec, data = read_job(job)
    put_on_path(spec.code)
    tf_runner.train_as(role, spec, data, job / f"checkpoints-{role.task_type}-{role.task_index}")


def _spark_work(job: Path) -> None:
    from svc_trainer.backends.tensorflow import spark

    spark.work(job, _role(local=False))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m svc_trainer.backends.tensorflow.cluster")
    parser.add_argument("mode", choices=("worker", "server", "spark-worker"))
    parser.add_argument("--job", type=Path, help="the job directory (worker, spark-worker)")
    args = parser.parse_args(argv)
    # First: a chief killed while this child imports TensorFlow must not leave it behind.
    die_with_parent()
    configure_logging("svc_trainer")
    # SIGTERM from the chief: exit now (default handler), no half-finished cleanup.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if args.mode == "server":
        _serve()
        return 0
    if args.job is None:
        parser.error(f"{args.mode} needs --job")
    if args.mode == "spark-worker":
        _spark_work(args.job)
    else:
        _work(args.job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
