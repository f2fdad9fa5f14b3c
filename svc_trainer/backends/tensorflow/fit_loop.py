"""The Keras ``model.fit`` loop of the one-process strategies (``one_device``,
``mirrored``, ``central_storage``): the per-epoch work (timing, checkpoint,
report, the stop decision) runs as Keras callbacks."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from shared.log import get_logger
from svc_trainer.backends.tensorflow import models as tf_models
from svc_trainer.backends.tensorflow.checkpoints import Checkpoints
from svc_trainer.backends.tensorflow.epochs import (
    STOP_CHECK_INTERVAL_S,
    epoch_metrics,
    evaluate_local,
    scored_test_metrics,
    targets,
)
from svc_trainer.plan import Channel, DataSplits, RunResult, RunSpec, StopReason, learning_rate

log = get_logger("svc_trainer")


class EpochLoop:
    """The per-epoch work of a ``model.fit`` run, as Keras callbacks: time the
    training steps, checkpoint, report, and decide whether to stop.

    A stop seen between batches abandons the epoch: it is neither
    checkpointed nor reported, so a resume repeats it."""

    def __init__(
        self,
        spec: RunSpec,
        data: DataSplits,
        channel: Channel,
        checkpoints: Checkpoints,
        model: Any,
        start: int,
    ) -> None:
        self._spec, self._data, self._channel = spec, data, channel
        self._checkpoints, self._model = checkpoints, model
        self.completed = start
        self.stopped = StopReason.NONE
        self.metrics: dict[str, float] = {}
        self._interrupted = False
        self._epoch_began = self._last_step = 0.0
        self._next_check = 0.0

    def callback(self) -> Any:
        import keras

        return keras.callbacks.LambdaCallback(
            on_epoch_begin=self._on_epoch_begin,
            on_train_batch_end=self._on_batch_end,
            on_epoch_end=self._on_epoch_end,
        )

    def _on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        rate = learning_rate(self._spec.hparams.learning_rate, epoch + 1, self._spec.epochs)
        self._model.optimizer.learning_rate.assign(rate)
        self._epoch_began = self._last_step = time.perf_counter()

    def _on_batch_end(self, batch: int, logs: Any = None) -> None:
        # Keras has synchronised on the step's logs: this is when the step ended.
        self._last_step = now = time.perf_counter()
        if now < self._next_check:
            return
        self._next_check = now + STOP_CHECK_INTERVAL_S
        reason = self._channel.stop_requested()
        if reason is not StopReason.NONE:
            self.stopped, self._interrupted = reason, True
            self._model.stop_training = True

    def _on_epoch_end(self, epoch: int, logs: Mapping[str, float] | None = None) -> None:
        if self._interrupted:
            return
        step = epoch + 1
        seconds = max(self._last_step - self._epoch_began, 1e-9)
        logs = logs or {}
        val = evaluate_local(self._model, self._data, "val", self._spec.hparams.batch_size)
        metrics = epoch_metrics(self._data.task, logs["loss"], val)
        metrics["samples_per_s"] = len(self._data.x_train) / seconds
        self._checkpoints.save(step)
        self.completed, self.metrics = step, metrics
        self._channel.epoch(step, metrics)
        log.info("tf.epoch", trial_id=self._spec.trial_id, step=step, **metrics)
        if step < self._spec.epochs:
            reason = self._channel.stop_requested()
            if reason is not StopReason.NONE:
                self.stopped = reason
                self._model.stop_training = True


def _replica_updated_state(strategy: Any) -> contextlib.AbstractContextManager[Any]:
    """Under CentralStorageStrategy every variable is one copy that replicas
    update through an aggregation, and Keras' random-seed state (Dropout's)
    has none ("You must specify an aggregation method to update a
    AggregatingVariable in Replica Context"): such state takes the first
    replica's update. Other strategies create their variables unchanged."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy):
        return contextlib.nullcontext()
    none = tf.VariableAggregation.NONE

    def creator(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
        if kwargs.get("aggregation") in (None, none) and not kwargs.get("trainable", True):
            kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
        return next_creator(**kwargs)

    return cast(contextlib.AbstractContextManager[Any], tf.variable_creator_scope(creator))


def train_fit(
    spec: RunSpec, data: DataSplits, channel: Channel, strategy: Any
) -> tuple[RunResult, Any]:
    """Train under ``strategy`` with ``model.fit`` from the last good
    checkpoint; returns the result and the trained model."""
    hp = spec.hparams
    with strategy.scope(), _replica_updated_state(strategy):
        model = tf_models.model_for(spec, data)
        tf_models.compile_model(model, hp, data.task)
        # Built now, so that a checkpoint restores the optimizer's slots too.
        model.optimizer.build(model.trainable_variables)
    checkpoints = Checkpoints(Path(spec.checkpoint_dir), model, model.optimizer)
    start, note = checkpoints.restore()
    channel.started(start, note)
    log.info("tf.started", trial_id=spec.trial_id, resumed_from_step=start, note=note)
    loop = EpochLoop(spec, data, channel, checkpoints, model, start)
    # Validation and test are scored in NumPy batches (``_evaluate_local``),
    # not by Keras' evaluate: dropping a spent tf.data iterator in Keras'
    # per-epoch evaluation reset segfaulted, now and then, a process that
    # had run many trials (TensorFlow 2.21, Keras 3.15).
    if start < spec.epochs:
        model.fit(
            data.x_train,
            targets(data, data.y_train),
            batch_size=hp.batch_size,
            epochs=spec.epochs,
            initial_epoch=start,
            callbacks=[loop.callback()],
            shuffle=True,
            verbose=0,
        )
    if loop.stopped is not StopReason.NONE:
        log.info("tf.stopped", trial_id=spec.trial_id, reason=loop.stopped.name, at=loop.completed)
        return RunResult(loop.completed, loop.stopped, loop.metrics), model
    val_metrics = loop.metrics
    if not val_metrics:
        # Every epoch was done by an earlier attempt: measure what it left.
        train_eval = evaluate_local(model, data, "train", hp.batch_size)
        val_eval = evaluate_local(model, data, "val", hp.batch_size)
        val_metrics = epoch_metrics(data.task, train_eval["loss"], val_eval)
    test_eval = evaluate_local(model, data, "test", hp.batch_size)
    result = RunResult(
        epochs_completed=max(start, loop.completed),
        val_metrics=val_metrics,
        test_metrics=scored_test_metrics(data.task, test_eval),
    )
    return result, model
