"""svc_trainer's TensorFlow runner: ``run(spec, data, channel)`` per ``plan``.

Strategies (``spec.strategy``):

- ``one_device`` (also ``single`` and ``""``): OneDeviceStrategy on the first
  GPU (unless ``spec.device == "cpu"``), else the CPU; Keras ``model.fit``.
- ``mirrored``: MirroredStrategy over the local GPUs (NCCL all-reduce) or, on a
  CPU-only host, over ``world_size`` (default 2) logical CPU devices.
- ``central_storage``: CentralStorageStrategy: the variables live on one
  device (the CPU, or the one GPU when there is a single one) and the compute
  is mirrored over the local GPUs, or ``world_size`` (default 2) logical CPU
  devices; Keras ``model.fit``.
- ``multi_worker_mirrored``: synchronous data parallelism over ``world_size``
  (default: one per GPU, else 2) worker processes: this process is worker 0,
  the others are started by ``backends.tensorflow.cluster`` on free localhost ports (or
  ``spec.tf_config`` names a multi-node cluster). RING collectives on CPUs;
  NCCL on GPUs, one GPU per worker (more workers than GPUs is refused). At the
  end of each epoch the chief's stop decision is all-reduced, so every worker
  stops after the same epoch.
- ``parameter_server``: asynchronous ParameterServerStrategy. This process is
  the coordinator; ``options["ps"]`` (default 1) parameter servers and
  ``world_size`` (default 1) workers run as ``tf.distribute.Server`` children.
  Keras 3's ``fit`` has no ParameterServerStrategy support, so a custom loop
  schedules per-worker steps with a ``ClusterCoordinator``.

The model is a built-in family's or the user's (``task.model``); a
training loop of the user's (``task.entrypoint``) replaces the platform's
loops under every strategy (``user_loop``).

In every strategy the global batch is ``hparams.batch_size`` (split over the
replicas), so a trial means the same optimisation whatever runs it. Only the
chief talks to the channel, restores and writes ``spec.checkpoint_dir`` and
exports. ``train`` is ``run`` without the export; it returns the trained
Keras model, which outputs logits (classification) or the prediction
(regression) — the export adds the softmax.

This module composes the runner from one module per job: ``strategy``
(strategy names, the checks, the cluster roles), ``devices`` (device
set-up, the ``tf.distribute`` strategy), ``fit_loop`` and
``custom_loop`` (the two training loops, sharing ``epochs``),
``checkpoints``, ``export``; ``backends.tensorflow.cluster`` runs the other processes.
"""

from __future__ import annotations

import gc
import importlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from shared.log import get_logger
from svc_trainer.backends.tensorflow.cluster import LocalCluster, Role
from svc_trainer.backends.tensorflow.custom_loop import train_custom
from svc_trainer.backends.tensorflow.devices import configure, distribution
from svc_trainer.backends.tensorflow.export import EXPORT_FORMAT, export
from svc_trainer.backends.tensorflow.fit_loop import train_fit
from svc_trainer.backends.tensorflow.strategy import (
    CENTRAL_STORAGE,
    LOCAL_STRATEGIES,
    MIRRORED,
    MULTI_WORKER,
    PARAMETER_SERVER,
    check,
    given_role,
    local_role,
    local_workers,
    strategy_of,
)
from svc_trainer.plan import (
    Channel,
    DataSplits,
    RunResult,
    RunSpec,
    SilentChannel,
    StopReason,
    TrialError,
)
from svc_trainer.user_code.packages import put_on_path

log = get_logger("svc_trainer")

# Workers run the same final evaluation as the chief and then exit by themselves.
WORKERS_EXIT_TIMEOUT_S = 60.0


def run(spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
    """Train (see ``train``) and, when every epoch ran, export a SavedModel
    into ``spec.export_dir`` (chief only). A ``multi_worker_mirrored`` trial
    with ``task.options.launcher: spark`` runs its workers as Spark barrier
    tasks (``spark``)."""
    put_on_path(spec.code)  # an executor of the package has it already
    strategy = strategy_of(spec)
    if strategy == MULTI_WORKER and spec.launcher == "spark":
        from svc_trainer.backends.tensorflow.spark import mwms_on_spark

        check(spec, data)
        return mwms_on_spark(spec, data, channel, local_workers(spec))
    result, model = train(spec, data, channel)
    given = given_role(spec, strategy)
    if given is not None and not given.is_chief:
        return result
    return finish(spec, data, result, model)


def finish(spec: RunSpec, data: DataSplits, result: RunResult, trained: Any) -> RunResult:
    """The chief's result with its model exported into ``spec.export_dir``:
    the trained Keras model of a built-in loop, or what a user's loop asked
    to export; nothing for a run that stopped early or exports nothing."""
    if spec.entrypoint:
        from svc_trainer.backends.tensorflow import user_loop

        return user_loop.finish(spec, result, trained)
    if result.stopped is not StopReason.NONE or not spec.export:
        return result
    inputs, outputs = export(trained, spec, data)
    return replace(result, export_format=EXPORT_FORMAT, inputs=inputs, outputs=outputs)


def train(spec: RunSpec, data: DataSplits, channel: Channel) -> tuple[RunResult, Any]:
    """Train ``spec.epochs`` epochs from the last good checkpoint; no export.

    Returns the result and the trained ``keras.Model`` (logits for a
    classifier), or for a training loop of the user's what it asked to
    export (an ``aistack.trial.ExportRequest``, or None). Meant to run in a
    fresh process: it configures TensorFlow globally (threads, logical
    devices, precision policy, seeds). Raises
    TrialError (before any training) for a configuration that cannot train;
    any other exception is the machine's fault. Child processes are reaped
    before it returns or raises."""
    strategy = check(spec, data)
    role = given_role(spec, strategy) or local_role(spec, strategy)
    log.info(
        "tf.train.begin",
        trial_id=spec.trial_id,
        strategy=strategy,
        model_family=spec.model_family,
        epochs=spec.epochs,
        tasks={k: len(v) for k, v in role.cluster.items()},
    )
    with LocalCluster(role, spec.trial_id) as cluster:
        # Children first: they import TensorFlow while this process does.
        if role.local and strategy == MULTI_WORKER:
            cluster.start_workers(spec, data)
            cluster.watch(_abort_collectives)
        elif role.local and strategy == PARAMETER_SERVER:
            cluster.start_servers()
        result, model = _train(spec, data, channel, strategy, role)
        if strategy == PARAMETER_SERVER:
            # Free the remote functions and variables while their servers still answer.
            gc.collect()
        if strategy == MULTI_WORKER and not cluster.wait(WORKERS_EXIT_TIMEOUT_S):
            log.warning("tf.workers.lingering", trial_id=spec.trial_id, pids=cluster.pids)
        if failed := cluster.failed():
            log.warning("tf.workers.failed", trial_id=spec.trial_id, tasks=failed)
    return result, model


def train_in_cluster(
    spec: RunSpec, data: DataSplits, channel: Channel, role: Role, scratch: Path
) -> tuple[RunResult, Any]:
    """One MultiWorkerMirrored worker's training in a cluster another launcher
    started (a Spark barrier task's, ``spark``): the chief's result and model
    (or export request); the others' throw-away checkpoints go to
    ``scratch``."""
    check(spec, data)
    return _train(spec, data, channel, MULTI_WORKER, role, scratch)


def train_as(role: Role, spec: RunSpec, data: DataSplits, scratch: Path) -> None:
    """A non-chief MultiWorkerMirrored worker's part of ``train`` (run by
    ``backends.tensorflow.cluster``): same model and steps, silent; its throw-away checkpoints
    go to ``scratch`` (inside the chief's job directory, which the chief
    removes even when this worker was killed)."""
    _train(spec, data, SilentChannel(), strategy_of(spec), role, scratch)


def _train(
    spec: RunSpec,
    data: DataSplits,
    channel: Channel,
    strategy_name: str,
    role: Role,
    scratch: Path | None = None,
) -> tuple[RunResult, Any]:
    devices = configure(spec, strategy_name, role)
    strategy = distribution(spec, strategy_name, role, devices)
    log.info(
        "tf.strategy",
        trial_id=spec.trial_id,
        strategy=strategy_name,
        task=f"{role.task_type}:{role.task_index}" if role.cluster else "local",
        replicas=int(strategy.num_replicas_in_sync),
        gpus=devices.gpus,
        mixed_precision=devices.mixed_precision,
    )
    if spec.entrypoint:
        from svc_trainer.backends.tensorflow import user_loop

        return user_loop.train(spec, data, channel, strategy, strategy_name, role)
    if strategy_name in LOCAL_STRATEGIES:
        return train_fit(spec, data, channel, strategy)
    return train_custom(spec, data, channel, strategy, strategy_name, role, scratch)


def _abort_collectives(task: str, code: int) -> None:
    """Fail this process's pending and future collectives (a worker died):
    the run raises instead of waiting for it forever."""
    import tensorflow as tf

    log.error("tf.worker.died", task=task, code=code)
    # TensorFlow's own peer health check (off by default) does the same.
    context: Any = importlib.import_module("tensorflow.python.eager.context")
    context.context().abort_collective_ops(
        tf.errors.UNAVAILABLE, f"worker {task} exited with code {code}"
    )


class TensorFlowRunner:
    """``plan.Runner`` for TensorFlow."""

    name = "tensorflow"

    def warm_up(self, threads: int) -> None:
        import keras
        import tensorflow as tf

        if threads > 0:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
        # Start the runtime and trace one tiny fit: what every first trial of
        # a process would otherwise pay.
        tiny = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        tiny.compile(optimizer="adam", loss="mse")
        tiny.fit(np.zeros((8, 4), np.float32), np.zeros((8, 2), np.float32), verbose=0)
        self.release()

    def fresh_process(self, spec: RunSpec) -> bool:
        """MultiWorkerMirrored and the parameter-server coordinator configure
        the runtime's collectives and cluster, which must happen before the
        runtime starts; so do logical CPU devices (``mirrored`` and
        ``central_storage`` without GPUs) and hiding the GPUs (``device:
        cpu`` on a GPU host)."""
        import tensorflow as tf

        try:
            strategy = strategy_of(spec)
            on_spark = spec.launcher == "spark"
        except TrialError:
            return False  # the run refuses it with its reason
        if on_spark:
            return False  # its workers run in processes of their own; this one drives Spark
        gpus = bool(tf.config.list_physical_devices("GPU"))
        return (
            strategy in (MULTI_WORKER, PARAMETER_SERVER)
            or (strategy in (MIRRORED, CENTRAL_STORAGE) and not gpus)
            or (spec.device == "cpu" and gpus)
        )

    def run(self, spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
        return run(spec, data, channel)

    def release(self) -> None:
        # Keras keeps every model and graph of the process until told;
        # TensorFlow keeps its GPU memory pool (it is reused, not returned).
        import keras

        keras.backend.clear_session()
        gc.collect()


RUNNER = TensorFlowRunner()
