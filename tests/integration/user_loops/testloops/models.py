"""Models of a user's for the strategies' tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

import aistack


class Plain(nn.Module):
    """Not an nn.Sequential: model parallelism cannot cut it."""

    def __init__(self, inputs: int, outputs: int) -> None:
        super().__init__()
        self.layer = nn.Linear(inputs, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.flatten(1))


def plain(params: Mapping[str, Any], data: aistack.Dataset) -> nn.Module:
    inputs = 1
    for dim in data.input_shape:
        inputs *= dim
    return Plain(inputs, data.n_outputs)


def sequential(params: Mapping[str, Any], data: aistack.Dataset) -> nn.Module:
    width = int(params.get("width", 16))
    inputs = 1
    for dim in data.input_shape:
        inputs *= dim
    return nn.Sequential(
        nn.Flatten(), nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, data.n_outputs)
    )


def keras_mlp(params: Mapping[str, Any], data: aistack.Dataset) -> Any:
    import keras

    inputs = keras.Input(shape=data.input_shape, name="input")
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(int(params.get("width", 16)), activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(data.n_outputs)(x))
