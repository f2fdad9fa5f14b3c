"""The trial context of a TensorFlow training loop, and how its model is
exported for the model server.

The platform calls a TensorFlow loop inside its strategy's scope
(``tf_strategy``: OneDevice, Mirrored, CentralStorage, MultiWorkerMirrored,
or ParameterServer's coordinator), so a model built in the loop has the
strategy's variables. ``prepare_data_loader`` distributes a ``tf.data``
dataset over the replicas (its batch is the global batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aistack.trial import (
    FRAMEWORK_TENSORFLOW,
    Exported,
    ExportFailed,
    ExportRequest,
    TensorDescription,
    TrialContext,
)

EXPORT_FORMAT = "tf_saved_model"
SERVING_SIGNATURE = "serving_default"

_DATATYPES = {
    "float32": "FP32",
    "float64": "FP64",
    "float16": "FP16",
    "int64": "INT64",
    "int32": "INT32",
    "int16": "INT16",
    "int8": "INT8",
    "uint8": "UINT8",
    "bool": "BOOL",
}


class TensorFlowContext(TrialContext):
    """The context of a TensorFlow trial: ``tf_strategy`` is the
    ``tf.distribute.Strategy`` whose scope the loop runs in."""

    framework = FRAMEWORK_TENSORFLOW

    def __init__(self, *, tf_strategy: Any, **common: Any) -> None:
        super().__init__(**common)
        self.tf_strategy = tf_strategy

    @property
    def device(self) -> str:
        devices = tuple(self.tf_strategy.extended.worker_devices)
        return str(devices[0]) if devices else "/CPU:0"

    def prepare_model(self, model: Any) -> Any:
        # Built in the strategy's scope (the loop runs in it), its variables
        # are the strategy's already.
        return model

    def prepare_data_loader(self, loader: Any) -> Any:
        return self.tf_strategy.experimental_distribute_dataset(loader)

    def data_loader(
        self, split: str = "train", *, batch_size: int = 32, shuffle: Any = None
    ) -> Any:
        import tensorflow as tf

        x, y = self.data.split(split)
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        if (split == "train") if shuffle is None else bool(shuffle):
            dataset = dataset.shuffle(len(x), seed=self.seed, reshuffle_each_iteration=True)
        return self.prepare_data_loader(dataset.batch(batch_size))


def export(request: ExportRequest, export_dir: Path) -> Exported:
    """A SavedModel of the request's Keras model (or any callable TensorFlow
    module) with one signature, ``serving_default``: input "input" (the
    example's dtype, batch first), outputs by name. The weights are copied
    into a clone outside any strategy when Keras can clone the model, so the
    SavedModel holds plain variables whatever trained them. Raises
    ExportFailed."""
    import tensorflow as tf

    model = _plain_copy(request.model)
    example = np.asarray(request.example)
    if example.ndim == 0:
        raise ExportFailed("export's example must be a batch (its first dimension the batch)")
    try:
        out = model(example, training=False)
    except TypeError:
        out = model(example)
    names = _output_names(out, request.output_names)

    def serve(input: Any) -> dict[str, Any]:
        try:
            result = model(input, training=False)
        except TypeError:
            result = model(input)
        return dict(zip(names, _as_list(result), strict=True))

    signature = [
        tf.TensorSpec((None, *example.shape[1:]), tf.as_dtype(example.dtype), name="input")
    ]
    function = tf.function(serve, input_signature=signature)
    module = tf.Module()
    module.model = model
    module.serve = function
    export_dir.mkdir(parents=True, exist_ok=True)
    try:
        tf.saved_model.save(module, str(export_dir), signatures={SERVING_SIGNATURE: function})
    except Exception as exc:
        raise ExportFailed(
            f"tf.saved_model.save refused the model: {type(exc).__name__}: {str(exc)[:500]}"
        ) from exc
    outputs: list[TensorDescription] = []
    for name, value in zip(names, _as_list(out), strict=True):
        array = np.asarray(value)
        outputs.append((name, _datatype(array.dtype), (-1, *array.shape[1:])))
    inputs = (("input", _datatype(example.dtype), (-1, *example.shape[1:])),)
    return Exported(EXPORT_FORMAT, inputs, tuple(outputs))


def _plain_copy(model: Any) -> Any:
    import keras

    if not isinstance(model, keras.Model):
        return model
    try:
        clone = keras.models.clone_model(model)
        clone.set_weights(model.get_weights())
    except Exception:  # a subclassed model Keras cannot clone: saved as it is
        return model
    return clone


def _as_list(out: Any) -> list[Any]:
    if isinstance(out, Mapping):
        return list(out.values())
    if isinstance(out, list | tuple):
        return list(out)
    return [out]


def _output_names(out: Any, names: tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(out, Mapping):
        return tuple(str(k) for k in out)
    count = len(out) if isinstance(out, list | tuple) else 1
    if names:
        if len(names) != count:
            raise ExportFailed(f"the model gives {count} outputs, output_names has {len(names)}")
        return names
    return ("output",) if count == 1 else tuple(f"output_{i}" for i in range(count))


def _datatype(dtype: Any) -> str:
    name = np.dtype(dtype).name
    if name not in _DATATYPES:
        raise ExportFailed(f"dtype {name} has no Open Inference Protocol datatype")
    return _DATATYPES[name]
