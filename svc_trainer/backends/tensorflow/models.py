"""The Keras models the TensorFlow runner trains, and their optimisers.

The family is specified precisely so that ``torch_models`` builds the same
networks (same layers, same shapes, same normalisation):

- ``cnn`` (classification on images (N, H, W)): a channel axis is added; then
  for ``i`` in ``range(conv_layers)``: Conv2D(filters * 2**i, kernel_width,
  padding="same", activation), followed by MaxPool2D(2) (floor) while the
  map's smaller side is >= POOL_MIN_WIDTH (8); then Flatten; then ``dense_layers`` x
  [Dense(units, activation), Dropout(dropout)]; then Dense(n_classes) logits.
- ``mlp`` (regression on (N, F), or classification on images flattened to
  (N, H*W)): a Normalization layer whose mean and variance are the TRAIN
  split's per-feature population statistics (variance 0 → 1, as sklearn's
  StandardScaler, so that a feature constant in training cannot blow up at
  serving time); then ``dense_layers`` x [Dense, Dropout]; then Dense(1)
  (regression) or Dense(n_classes) logits.

Every model returns logits (classification) or the prediction (regression)
in float32, also under a mixed-precision policy; the served softmax is added
at export. TensorFlow is imported here and in the other ``tf_*`` modules only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from svc_trainer.plan import (
    POOL_MIN_WIDTH,
    TASK_CLASSIFICATION,
    TASK_REGRESSION,
    DataSplits,
    Hyperparams,
    RunSpec,
    TrialError,
)

MODEL_FAMILIES = ("cnn", "mlp")


def check_fits(model_family: str, data: DataSplits) -> None:
    """Raise TrialError unless ``model_family`` can be trained on ``data``.

    unknown family → reason ``unknown_model``; a family that does not fit the
    task or the input's shape → reason ``invalid_params``."""
    if model_family not in MODEL_FAMILIES:
        raise TrialError(
            f"unknown model family {model_family!r}; the TensorFlow runner builds "
            f"{list(MODEL_FAMILIES)}",
            reason="unknown_model",
        )
    ndim = data.x_train.ndim
    if data.task == TASK_CLASSIFICATION:
        if data.n_classes < 2:
            raise TrialError(
                f"classification needs n_classes >= 2, the dataset {data.name!r} "
                f"has {data.n_classes}",
                reason="invalid_params",
            )
        if model_family == "cnn" and ndim != 3:
            raise TrialError(
                f"cnn needs images (N, H, W); {data.name!r} has x of shape {data.x_train.shape}",
                reason="invalid_params",
            )
        if model_family == "mlp" and ndim not in (2, 3):
            raise TrialError(
                f"mlp needs (N, F) or images (N, H, W); {data.name!r} has x of shape "
                f"{data.x_train.shape}",
                reason="invalid_params",
            )
    elif data.task == TASK_REGRESSION:
        if model_family != "mlp":
            raise TrialError(
                f"{model_family} is a classifier; regression on {data.name!r} needs mlp",
                reason="invalid_params",
            )
        if ndim not in (2, 3):
            raise TrialError(
                f"mlp needs (N, F) features; {data.name!r} has x of shape {data.x_train.shape}",
                reason="invalid_params",
            )
    else:
        raise TrialError(f"unknown task {data.task!r}", reason="invalid_params")


def model_for(spec: RunSpec, data: DataSplits) -> Any:
    """A fresh, built ``keras.Model`` for the trial: its built-in family
    (``build_model``) or the user's (``task.model``), under whatever
    ``tf.distribute`` scope is active."""
    if spec.model:
        import keras

        from svc_trainer.user_code import models as user_models

        return user_models.build(spec, data, keras.Model, "keras.Model")
    return build_model(spec.model_family, spec.hparams, data)


def feature_stats(x_train: NDArray[np.float32]) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """Per-feature mean and variance of the (flattened) training inputs, the
    constants of the mlp's Normalization layer; variance 0 becomes 1."""
    flat = x_train.reshape(len(x_train), -1).astype(np.float64)
    mean = flat.mean(axis=0)
    variance = flat.var(axis=0)
    variance[variance <= 0.0] = 1.0
    return mean.astype(np.float32), variance.astype(np.float32)


def build_model(model_family: str, hp: Hyperparams, data: DataSplits) -> Any:
    """A fresh, built ``keras.Model`` for ``data`` (call ``check_fits`` first).

    Built under whatever ``tf.distribute`` scope is active, so that its
    variables are the strategy's. Weights come from Keras' seeded initialisers:
    set ``keras.utils.set_random_seed`` before for a reproducible model."""
    import keras

    layers = keras.layers
    sample_shape = tuple(int(d) for d in data.x_train.shape[1:])
    inputs = keras.Input(shape=sample_shape, dtype="float32", name="input")
    x: Any = inputs
    if model_family == "cnn":
        height, width = sample_shape
        if hp.augment > 0:
            x = random_shift(hp.augment)(x)
        x = layers.Reshape((height, width, 1), name="add_channel")(x)
        for i in range(hp.conv_layers):
            x = layers.Conv2D(
                hp.filters * 2**i,
                hp.kernel_width,
                padding="same",
                activation=hp.activation,
                name=f"conv{i}",
            )(x)
            if min(height, width) >= POOL_MIN_WIDTH:
                x = layers.MaxPool2D(2, name=f"pool{i}")(x)
                height, width = height // 2, width // 2
        x = layers.Flatten(name="flatten")(x)
    else:
        if len(sample_shape) > 1:
            x = layers.Flatten(name="flatten")(x)
        mean, variance = feature_stats(data.x_train)
        x = layers.Normalization(mean=mean, variance=variance, name="normalize")(x)
    for i in range(hp.dense_layers):
        x = layers.Dense(hp.units, activation=hp.activation, name=f"dense{i}")(x)
        x = layers.Dropout(hp.dropout, name=f"dropout{i}")(x)
    width_out = data.n_classes if data.task == TASK_CLASSIFICATION else 1
    # float32 head: logits and predictions stay float32 under mixed_float16.
    outputs = layers.Dense(width_out, dtype="float32", name="head")(x)
    if data.task != TASK_CLASSIFICATION:
        # The head predicts the standardised target; this maps it back, so a
        # regressor starts near the training mean (as the PyTorch family does).
        y = data.y_train.astype(np.float64)
        std = float(y.std()) or 1.0
        outputs = layers.Rescaling(std, offset=float(y.mean()), dtype="float32", name="target")(
            outputs
        )
    return keras.Model(inputs, outputs, name=f"{model_family}_{data.name}")


def random_shift(fraction: float) -> Any:
    """A layer that, while training, moves a random ``fraction`` of the
    images (N, H, W) by up to one pixel each way (zeros fill the edge), as
    ``torch_models.RandomShift``; the identity otherwise."""
    import keras
    import tensorflow as tf

    class RandomShift(keras.layers.Layer):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(name="random_shift")
            self.seeds = keras.random.SeedGenerator()

        def call(self, x: Any, training: Any = None) -> Any:
            if not training:
                return x
            height, width = int(x.shape[1]), int(x.shape[2])
            padded = tf.pad(x, [[0, 0], [1, 1], [1, 1]])
            shifts = [(dy, dx) for dy in range(3) for dx in range(3)]
            moved = tf.stack(
                [padded[:, dy : dy + height, dx : dx + width] for dy, dx in shifts], axis=1
            )
            n = tf.shape(x)[:1]
            choice = keras.random.randint(n, 0, 9, seed=self.seeds)
            kept = keras.random.uniform(n, seed=self.seeds) >= fraction
            choice = tf.where(kept, tf.constant(4, choice.dtype), choice)  # 4: not moved
            return tf.gather(moved, choice, batch_dims=1)

    return RandomShift()


def make_optimizer(hp: Hyperparams) -> Any:
    """The Keras optimiser ``hp`` names; weight decay is passed only when > 0
    (Keras applies decoupled decay to every optimiser that receives it)."""
    import keras

    decay: dict[str, float] = {"weight_decay": hp.weight_decay} if hp.weight_decay > 0 else {}
    opt = keras.optimizers
    if hp.optimizer == "adam":
        return opt.Adam(learning_rate=hp.learning_rate, **decay)
    if hp.optimizer == "adamw":
        # AdamW's own default decay (0.004) would silently regularise a trial that asked for 0.
        return opt.AdamW(learning_rate=hp.learning_rate, weight_decay=hp.weight_decay)
    if hp.optimizer == "sgd":
        return opt.SGD(learning_rate=hp.learning_rate, momentum=hp.momentum, **decay)
    if hp.optimizer == "rmsprop":
        return opt.RMSprop(learning_rate=hp.learning_rate, **decay)
    raise TrialError(f"unknown optimizer {hp.optimizer!r}", reason="invalid_params")


def compile_model(model: Any, hp: Hyperparams, task: str) -> None:
    """Compile with the task's loss and metrics: sparse categorical
    cross-entropy from logits + accuracy, or MSE + MAE."""
    import keras

    if task == TASK_CLASSIFICATION:
        model.compile(
            optimizer=make_optimizer(hp),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
    else:
        model.compile(
            optimizer=make_optimizer(hp),
            loss=keras.losses.MeanSquaredError(),
            metrics=[keras.metrics.MeanAbsoluteError(name="mae")],
        )
