"""A trained TensorFlow model as the SavedModel the model server loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.log import get_logger
from svc_trainer.backends.tensorflow import models as tf_models
from svc_trainer.plan import TASK_CLASSIFICATION, DataSplits, RunSpec, TensorSig

log = get_logger("svc_trainer")

EXPORT_FORMAT = "tf_saved_model"


def export(
    model: Any, spec: RunSpec, data: DataSplits
) -> tuple[tuple[TensorSig, ...], tuple[TensorSig, ...]]:
    """Write ``model`` as a SavedModel into ``spec.export_dir``: signature
    ``serving_default``, input "input" FP32 (-1, *sample shape), output
    "probabilities" (softmax, (-1, n_classes)) or "prediction" ((-1, 1)).

    The weights are copied into a fresh float32 model outside any strategy, so
    the SavedModel holds plain variables whatever trained them (and computes
    in float32 even when training used mixed precision). Returns the
    signature's (inputs, outputs) as RunResult carries them."""
    import keras
    import tensorflow as tf

    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        served = tf_models.model_for(spec, data)
    finally:
        keras.mixed_precision.set_global_policy(policy)
    served.set_weights(model.get_weights())
    sample_shape = tuple(int(d) for d in data.x_train.shape[1:])
    classify = data.task == TASK_CLASSIFICATION
    out_name = "probabilities" if classify else "prediction"

    def serve_fn(input: Any) -> dict[str, Any]:
        out = served(input, training=False)
        return {out_name: tf.nn.softmax(out, axis=-1) if classify else out}

    # The argument's name is the signature's input name.
    signature = [tf.TensorSpec((None, *sample_shape), tf.float32, name="input")]
    serve = tf.function(serve_fn, input_signature=signature)
    module = tf.Module()
    module.model = served
    module.serve = serve
    Path(spec.export_dir).mkdir(parents=True, exist_ok=True)
    tf.saved_model.save(module, spec.export_dir, signatures={"serving_default": serve})
    width = data.n_classes if classify else 1
    log.info("tf.exported", trial_id=spec.trial_id, path=spec.export_dir)
    return (
        (TensorSig("input", "FP32", (-1, *sample_shape)),),
        (TensorSig(out_name, "FP32", (-1, width)),),
    )
