"""The custom training loop of the multi-process strategies
(``multi_worker_mirrored``, ``parameter_server``), which Keras 3's ``fit``
cannot drive."""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shared.log import get_logger
from svc_trainer.backends.tensorflow import models as tf_models
from svc_trainer.backends.tensorflow.checkpoints import Checkpoints
from svc_trainer.backends.tensorflow.cluster import Role
from svc_trainer.backends.tensorflow.epochs import (
    STOP_CHECK_INTERVAL_S,
    epoch_metrics,
    evaluate_local,
    scored_test_metrics,
    targets,
)
from svc_trainer.backends.tensorflow.strategy import PARAMETER_SERVER
from svc_trainer.plan import (
    TASK_CLASSIFICATION,
    Channel,
    DataSplits,
    RunResult,
    RunSpec,
    StopReason,
    learning_rate,
)

log = get_logger("svc_trainer")


@dataclass(frozen=True)
class _Steps:
    """How a custom loop runs training steps on its strategy."""

    # Launch one step; returns a handle on its loss.
    launch: Callable[[], Any]
    # The step's loss from its handle (waits for the step).
    loss: Callable[[Any], float]
    # Wait for every launched step.
    join: Callable[[], None]
    # Launch at most this many steps ahead of the finished ones (0: no limit).
    in_flight: int
    # May a stop interrupt an epoch? Only where one process launches every step.
    between_batches: bool
    # Every task's stop decision from the chief's (the identity with one process).
    agree: Callable[[StopReason], StopReason]
    # Samples per step, over all replicas.
    global_batch: int


def train_custom(
    spec: RunSpec,
    data: DataSplits,
    channel: Channel,
    strategy: Any,
    name: str,
    role: Role,
    scratch: Path | None,
) -> tuple[RunResult, Any]:
    """MultiWorkerMirrored (Keras 3's ``fit`` cannot drive it: its symbolic
    build reduces the input batch across workers and fails) and
    ParameterServer (no ``fit`` support in Keras 3): one loop, ``steps =
    ceil(N / batch)`` steps an epoch over a repeated, shuffled dataset.

    Multi-worker: every worker runs every step (an all-reduce of gradients),
    every worker checkpoints (a save may read sync-on-read variables), the
    chief's restored state and its stop decision reach the others through
    all-reduces, so all of them leave after the same epoch. Parameter server:
    the coordinator schedules the steps on whichever worker is free, at most
    a few in flight, so a stop lands within a few steps; the parameter
    servers hold the variables. Validation and test run in the chief's
    process, which holds (or reads) the current weights."""
    import keras
    import tensorflow as tf

    hp = spec.hparams
    chief = role.is_chief
    coordinator = (
        tf.distribute.coordinator.ClusterCoordinator(strategy) if name == PARAMETER_SERVER else None
    )
    with strategy.scope():
        model = tf_models.model_for(spec, data)
        optimizer = tf_models.make_optimizer(hp)
        if keras.mixed_precision.global_policy().name == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    classify = data.task == TASK_CLASSIFICATION
    loss_fn: Callable[[Any, Any], Any] = (
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        if classify
        else keras.losses.MeanSquaredError(reduction=None)
    )
    x_train, y_train = data.x_train, targets(data, data.y_train)
    # MultiWorker: the batch is split over the replicas; ParameterServer: one per step.
    replicas = int(strategy.num_replicas_in_sync) if coordinator is None else 1
    per_replica = max(1, hp.batch_size // replicas)
    global_batch = per_replica * replicas
    seed = spec.seed

    def dataset_fn(context: Any = None) -> Any:
        dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        if context is not None:
            # Multi-worker: every worker shuffles its shard in the same seeded order.
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
            dataset = dataset.shuffle(len(x_train), seed=seed, reshuffle_each_iteration=True)
        else:
            # Parameter server: the one traced function runs on every worker, and only an
            # unseeded shuffle (no global seed either) gives each worker its own order.
            dataset = dataset.shuffle(len(x_train), reshuffle_each_iteration=True)
        return dataset.repeat().batch(per_replica, drop_remainder=True).prefetch(2)

    def replica_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def step_fn(iterator: Any) -> Any:
        x, y = next(iterator)
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(x, y)), axis=None
        )

    train_step = tf.function(step_fn)
    if coordinator is not None:
        tf.random.set_seed(None)
        try:
            iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        finally:
            tf.random.set_seed(seed)
        workers = len(role.cluster.get("worker", ()))
        steps = _Steps(
            launch=lambda: coordinator.schedule(train_step, args=(iterator,)),
            loss=lambda handle: float(handle.fetch()),
            join=coordinator.join,
            in_flight=4 * max(1, workers),
            between_batches=True,
            agree=lambda reason: reason,
            global_batch=global_batch,
        )
    else:
        iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
        broadcast = chief_broadcast(strategy)

        def agree(reason: StopReason) -> StopReason:
            agreed = broadcast([tf.constant(float(reason), tf.float32)])
            return StopReason(round(float(agreed[0].numpy())))

        steps = _Steps(
            launch=lambda: train_step(iterator),
            loss=lambda handle: float(handle.numpy()),
            join=lambda: None,
            in_flight=0,
            between_batches=False,
            agree=agree,
            global_batch=global_batch,
        )
    # Non-chief workers write throw-away checkpoints: the chief's are the trial's.
    if chief:
        directory = Path(spec.checkpoint_dir)
    else:
        directory = scratch or Path(tempfile.mkdtemp(prefix="tf-worker-ckpt-"))
    try:
        checkpoints = Checkpoints(directory, model, optimizer)
        start, note = checkpoints.restore() if chief else (0, "")
        if coordinator is None:
            variables = [*model.variables, *optimizer.variables]
            values = chief_broadcast(strategy)(
                [tf.constant(start, tf.int64), *[v.value for v in variables]]
            )
            start = int(values[0].numpy())
            for variable, value in zip(variables, values[1:], strict=True):
                variable.assign(value)
        if chief:
            channel.started(start, note)
            log.info("tf.started", trial_id=spec.trial_id, resumed_from_step=start, note=note)
        completed, metrics, stopped = _custom_epochs(
            spec, data, channel, model, optimizer, checkpoints, steps, start=start, chief=chief
        )
    finally:
        if not chief:
            shutil.rmtree(directory, ignore_errors=True)
    # ParameterServer: the variables live on servers that go when ``train`` returns.
    trained = _local_copy(model, spec, data) if coordinator is not None else model
    if stopped is not StopReason.NONE:
        log.info("tf.stopped", trial_id=spec.trial_id, reason=stopped.name, at=completed)
        return RunResult(completed, stopped, metrics), trained
    if not chief:
        return RunResult(completed, StopReason.NONE, metrics), trained
    if not metrics:
        # Every epoch was done by an earlier attempt: measure what it left.
        train_loss = evaluate_local(trained, data, "train", hp.batch_size)["loss"]
        val = evaluate_local(trained, data, "val", hp.batch_size)
        metrics = epoch_metrics(data.task, train_loss, val)
    test = scored_test_metrics(data.task, evaluate_local(trained, data, "test", hp.batch_size))
    return RunResult(max(start, completed), StopReason.NONE, metrics, test), trained


def _custom_epochs(
    spec: RunSpec,
    data: DataSplits,
    channel: Channel,
    model: Any,
    optimizer: Any,
    checkpoints: Checkpoints,
    steps: _Steps,
    *,
    start: int,
    chief: bool,
) -> tuple[int, dict[str, float], StopReason]:
    """Epochs start+1..spec.epochs; (the last completed, its metrics, why it stopped)."""
    per_epoch = max(1, math.ceil(len(data.x_train) / steps.global_batch))
    completed = start
    metrics: dict[str, float] = {}
    next_check = 0.0
    for step in range(start + 1, spec.epochs + 1):
        optimizer.learning_rate.assign(learning_rate(spec.hparams.learning_rate, step, spec.epochs))
        began = time.perf_counter()
        handles: list[Any] = []
        stopped = StopReason.NONE
        for i in range(per_epoch):
            if steps.in_flight and i >= steps.in_flight:
                steps.loss(handles[i - steps.in_flight])
            if steps.between_batches and (now := time.perf_counter()) >= next_check:
                next_check = now + STOP_CHECK_INTERVAL_S
                stopped = channel.stop_requested()
                if stopped is not StopReason.NONE:
                    break
            handles.append(steps.launch())
        steps.join()
        if stopped is not StopReason.NONE:
            return completed, metrics, stopped
        losses = [steps.loss(h) for h in handles]
        seconds = max(time.perf_counter() - began, 1e-9)
        metrics = {}
        if chief:
            val = evaluate_local(model, data, "val", spec.hparams.batch_size)
            metrics = epoch_metrics(data.task, float(np.mean(losses)), val)
            metrics["samples_per_s"] = per_epoch * steps.global_batch / seconds
        checkpoints.save(step)
        completed = step
        if chief:
            channel.epoch(step, metrics)
            log.info("tf.epoch", trial_id=spec.trial_id, step=step, **metrics)
        if step < spec.epochs:
            stopped = steps.agree(channel.stop_requested())
            if stopped is not StopReason.NONE:
                return completed, metrics, stopped
    return completed, metrics, StopReason.NONE


def chief_broadcast(strategy: Any) -> Callable[[list[Any]], list[Any]]:
    """A function giving every worker the chief's values (replica 0's) of a
    list of tensors, through one all-reduce to which the others add zeros.
    Every worker must call it at the same point, with the same structure."""
    import tensorflow as tf

    def replica_fn(values: list[Any]) -> Any:
        context = tf.distribute.get_replica_context()
        first = tf.equal(context.replica_id_in_sync_group, 0)
        masked = [tf.where(first, v, tf.zeros_like(v)) for v in values]
        # One all-reduce per dtype: a collective packs its tensors into one buffer.
        by_dtype: dict[Any, list[int]] = {}
        for i, value in enumerate(masked):
            by_dtype.setdefault(value.dtype, []).append(i)
        out: list[Any] = [None] * len(masked)
        for indices in by_dtype.values():
            group = [masked[i] for i in indices]
            for i, value in zip(
                indices, context.all_reduce(tf.distribute.ReduceOp.SUM, group), strict=True
            ):
                out[i] = value
        return out

    compiled = tf.function(replica_fn)

    def broadcast(tensors: list[Any]) -> list[Any]:
        reduced = strategy.run(compiled, args=(tensors,))
        return [strategy.experimental_local_results(r)[0] for r in reduced]

    return broadcast


def _local_copy(model: Any, spec: RunSpec, data: DataSplits) -> Any:
    """The same network with this process's own variables holding ``model``'s
    weights (built outside any strategy scope)."""
    copy = tf_models.model_for(spec, data)
    copy.set_weights(model.get_weights())
    return copy
