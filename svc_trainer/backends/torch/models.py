"""The trainer's model families in PyTorch, built from a trial's parameters.

The same families as ``tf_models`` (Keras): a CNN for images and an MLP for
features. Each is an ``nn.Sequential`` of blocks, so that the model-parallel
strategy can cut it into two stages at ``split_point``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from svc_trainer.plan import (
    POOL_MIN_WIDTH,
    TASK_CLASSIFICATION,
    TASK_REGRESSION,
    DataSplits,
    Hyperparams,
    TensorSig,
    TrialError,
)

FAMILIES = ("cnn", "mlp")

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
}


class Standardize(nn.Module):
    """Scales raw features by the training split's mean and spread, inside the
    model, so that the served model takes raw features."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: np.ndarray[Any, Any], std: np.ndarray[Any, Any]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer(
            "std", torch.as_tensor(np.where(std > 0, std, 1.0), dtype=torch.float32)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class Rescale(nn.Module):
    """Maps the network's standardised output to the target's scale (the
    training split's mean and spread), so a regressor starts near the mean."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std if std > 0 else 1.0, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.std + self.mean


class RandomShift(nn.Module):
    """While training, moves a random ``fraction`` of the images (N, H, W) by
    up to one pixel each way (zeros fill the edge); the identity otherwise,
    so the exported model does not have it."""

    def __init__(self, fraction: float) -> None:
        super().__init__()
        self.fraction = fraction

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.fraction <= 0:
            return x
        n, height, width = x.shape
        padded = nn.functional.pad(x, (1, 1, 1, 1))
        offsets = torch.randint(0, 3, (2, n), device=x.device)
        kept = torch.rand(n, device=x.device) >= self.fraction
        offsets[:, kept] = 1  # the centre: not moved
        rows = offsets[0, :, None] + torch.arange(height, device=x.device)
        cols = offsets[1, :, None] + torch.arange(width, device=x.device)
        batch = torch.arange(n, device=x.device)[:, None, None]
        return padded[batch, rows[:, :, None], cols[:, None, :]]


def build(family: str, hp: Hyperparams, data: DataSplits) -> nn.Sequential:
    """The model for ``family`` on ``data``; TrialError when it does not fit."""
    if family not in FAMILIES:
        raise TrialError(
            f"unknown model family {family!r}; known: {', '.join(FAMILIES)}", reason="unknown_model"
        )
    outputs = data.n_classes if data.task == TASK_CLASSIFICATION else 1
    if family == "cnn":
        if data.task != TASK_CLASSIFICATION or data.x_train.ndim != 3:
            raise TrialError(
                "model family 'cnn' needs images (N, H, W) to classify; "
                f"dataset {data.name!r} has {data.task} inputs of shape {data.x_train.shape[1:]}",
                reason="invalid_params",
            )
        return _cnn(hp, data.x_train.shape[1], data.x_train.shape[2], outputs)
    flat = data.x_train.reshape(len(data.x_train), -1)
    model = _mlp(hp, flat.mean(axis=0), flat.std(axis=0), outputs)
    if data.task == TASK_REGRESSION:
        y = data.y_train.astype(np.float64)
        model.append(Rescale(float(y.mean()), float(y.std())))
    return model


def split_point(model: nn.Sequential) -> int:
    """Where model parallelism cuts the model: after the convolutions for a
    CNN (features on the first device, the dense head on the second), half
    way through the dense blocks for an MLP."""
    blocks = list(model)
    for index, block in enumerate(blocks):
        if isinstance(block, nn.Flatten):
            return index + 1
    return max(1, len(blocks) // 2)


def signature(data: DataSplits) -> tuple[tuple[TensorSig, ...], tuple[TensorSig, ...]]:
    """The served model's inputs and outputs (the same for both frameworks)."""
    inputs = (TensorSig("input", "FP32", (-1, *data.x_train.shape[1:])),)
    if data.task == TASK_REGRESSION:
        return inputs, (TensorSig("prediction", "FP32", (-1, 1)),)
    return inputs, (TensorSig("probabilities", "FP32", (-1, data.n_classes)),)


class Served(nn.Module):
    """What is exported: probabilities for a classifier, the value for a
    regressor (training uses the logits)."""

    def __init__(self, model: nn.Module, task: str) -> None:
        super().__init__()
        self.model = model
        self.classify = task == TASK_CLASSIFICATION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        return torch.softmax(out, dim=-1) if self.classify else out


def _cnn(hp: Hyperparams, height: int, width: int, classes: int) -> nn.Sequential:
    act = _ACTIVATIONS[hp.activation]
    blocks: list[nn.Module] = [RandomShift(hp.augment)] if hp.augment > 0 else []
    blocks.append(nn.Unflatten(1, (1, height)))
    channels, size = 1, min(height, width)
    for i in range(hp.conv_layers):
        filters = hp.filters * 2**i
        blocks += [
            nn.Conv2d(channels, filters, hp.kernel_width, padding=hp.kernel_width // 2),
            act(),
        ]
        channels = filters
        if size >= POOL_MIN_WIDTH:
            blocks.append(nn.MaxPool2d(2))
            height, width, size = height // 2, width // 2, size // 2
    blocks.append(nn.Flatten())
    blocks += _dense(hp, channels * height * width, act)
    blocks.append(nn.Linear(_last_width(hp, channels * height * width), classes))
    return nn.Sequential(*blocks)


def _mlp(
    hp: Hyperparams, mean: np.ndarray[Any, Any], std: np.ndarray[Any, Any], outputs: int
) -> nn.Sequential:
    act = _ACTIVATIONS[hp.activation]
    features = int(mean.size)
    blocks: list[nn.Module] = [nn.Flatten(), Standardize(mean, std)]
    blocks += _dense(hp, features, act)
    blocks.append(nn.Linear(_last_width(hp, features), outputs))
    return nn.Sequential(*blocks)


def _dense(hp: Hyperparams, width: int, act: type[nn.Module]) -> list[nn.Module]:
    blocks: list[nn.Module] = []
    for _ in range(hp.dense_layers):
        blocks += [nn.Linear(width, hp.units), act(), nn.Dropout(hp.dropout)]
        width = hp.units
    return blocks


def _last_width(hp: Hyperparams, width: int) -> int:
    return hp.units if hp.dense_layers else width


def optimizer(hp: Hyperparams, params: Any) -> torch.optim.Optimizer:
    if hp.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=hp.learning_rate, momentum=hp.momentum, weight_decay=hp.weight_decay
        )
    if hp.optimizer == "rmsprop":
        return torch.optim.RMSprop(params, lr=hp.learning_rate, weight_decay=hp.weight_decay)
    if hp.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=hp.learning_rate, weight_decay=hp.weight_decay)
    return torch.optim.Adam(params, lr=hp.learning_rate, weight_decay=hp.weight_decay)
