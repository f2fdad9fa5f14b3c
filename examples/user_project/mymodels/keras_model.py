"""The same model in Keras (``task.model: "mymodels.keras_model:build"``,
``framework: FRAMEWORK_TENSORFLOW``): aistack builds it inside its
strategy's scope and trains it with its own loop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras

import aistack


def build(params: Mapping[str, Any], data: aistack.Dataset) -> keras.Model:
    width = int(params.get("width", 32))
    depth = int(params.get("depth", 2))
    inputs = keras.Input(shape=data.input_shape, name="input")
    scale = keras.layers.Normalization(
        mean=data.x_train.mean(axis=0), variance=data.x_train.var(axis=0) + 1e-12
    )
    x = scale(inputs)
    for _ in range(depth):
        x = keras.layers.Dense(width, activation="relu")(x)
        x = keras.layers.Dropout(float(params.get("drop", 0.1)))(x)
    outputs = keras.layers.Dense(data.n_outputs)(x)  # logits
    return keras.Model(inputs, outputs)
