"""A PyTorch model of the user's (``task.model: "mymodels.torch_model:build"``).

aistack calls ``build`` with the trial's parameters and its data, and its
own loop trains what comes back (any strategy: single, ddp...), checkpoints
it, exports it (with a softmax: the model returns logits) and serves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

import aistack


class Scale(nn.Module):
    """The training split's mean and spread, kept inside the model so that
    the served model takes the raw measurements."""

    def __init__(self, mean: Any, std: Any) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32).clamp_min(1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def build(params: Mapping[str, Any], data: aistack.Dataset) -> nn.Module:
    width = int(params.get("width", 32))
    depth = int(params.get("depth", 2))
    layers: list[nn.Module] = [Scale(data.x_train.mean(axis=0), data.x_train.std(axis=0))]
    inputs = data.input_shape[0]
    for _ in range(depth):
        layers += [nn.Linear(inputs, width), nn.ReLU(), nn.Dropout(float(params.get("drop", 0.1)))]
        inputs = width
    layers.append(nn.Linear(inputs, data.n_outputs))
    return nn.Sequential(*layers)
