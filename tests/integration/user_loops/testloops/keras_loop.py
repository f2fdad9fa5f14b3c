"""A TensorFlow loop of a user's, written for any strategy: it runs in the
strategy's scope (``ctx.tf_strategy``), steps through ``strategy.run``, and
takes the same number of steps on every worker (a MultiWorkerMirrored
collective waits for all of them)."""

from __future__ import annotations

import keras
import tensorflow as tf

import aistack


def train(ctx: aistack.TrialContext) -> None:
    strategy = ctx.tf_strategy  # type: ignore[attr-defined]
    batch = 64
    model = keras.Sequential(
        [
            keras.Input(ctx.data.input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(int(ctx.params.get("width", 32)), activation="relu"),
            keras.layers.Dense(ctx.data.n_outputs),
        ]
    )
    optimizer = keras.optimizers.Adam(float(ctx.params.get("lr", 0.01)))
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(x, y)), axis=None
        )

    start = 1
    saved = ctx.restore()
    if saved is not None:
        model.set_weights(saved.state()["weights"])
        start = saved.step + 1
    batches = ctx.data_loader("train", batch_size=batch)
    steps = len(ctx.data.x_train) // batch // ctx.world_size
    for epoch in range(start, ctx.epochs + 1):
        iterator = iter(batches)
        for _ in range(steps):
            step(*next(iterator))
        logits = model(ctx.data.x_val, training=False)
        val_loss = float(tf.reduce_mean(loss_fn(ctx.data.y_val, logits)))
        accuracy = float(
            tf.reduce_mean(tf.cast(tf.argmax(logits, axis=1) == ctx.data.y_val, tf.float32))
        )
        ctx.report(
            epoch,
            {"val_loss": val_loss, "val_error": 1.0 - accuracy},
            checkpoint={"weights": model.get_weights()},
        )
    ctx.export(model, ctx.data.x_val[:2])
