"""What both TensorFlow training loops (``fit_loop``, ``custom_loop``)
share: the targets they train on, the metrics an epoch reports and how they
are scored, and how often a loop asks its channel for a stop.

Scores are computed in NumPy batches in the chief's process, not by Keras'
``evaluate`` (see ``fit_loop.train_fit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from svc_trainer.plan import (
    TASK_CLASSIFICATION,
    DataSplits,
    as_test_metrics,
    classification_metrics,
    regression_metrics,
)

# Between batches the channel is asked at most this often: a stop need not land
# faster than a tenth of a second, and fewer calls keep the step loop tight.
STOP_CHECK_INTERVAL_S = 0.1


def metric_names(task: str) -> tuple[str, ...]:
    """The names of every epoch's metrics for ``task``."""
    if task == TASK_CLASSIFICATION:
        return (*classification_metrics(0.0, 0.0, 0.0), "samples_per_s")
    return (*regression_metrics(0.0, 0.0, 0.0), "samples_per_s")


def targets(data: DataSplits, y: NDArray[Any]) -> NDArray[Any]:
    if data.task == TASK_CLASSIFICATION:
        return y.astype(np.int64)
    return y.astype(np.float32).reshape(-1, 1)


def epoch_metrics(task: str, loss: float, val: Mapping[str, float]) -> dict[str, float]:
    """``val`` holds "loss" and "accuracy" (classification) or "loss" (MSE)
    and "mae" of the validation split."""
    if task == TASK_CLASSIFICATION:
        return classification_metrics(float(loss), float(val["loss"]), float(val["accuracy"]))
    return regression_metrics(float(loss), float(val["loss"]), float(val["mae"]))


def scored_test_metrics(task: str, test: Mapping[str, float]) -> dict[str, float]:
    return as_test_metrics(epoch_metrics(task, float(test["loss"]), test))


def evaluate_local(model: Any, data: DataSplits, split: str, batch: int) -> dict[str, float]:
    """Loss and accuracy (or MSE and MAE) of ``split``, computed in this
    process: the mean cross-entropy from logits (or squared error) and the
    fraction of argmax hits (or the mean absolute error)."""
    x = getattr(data, f"x_{split}")
    y = targets(data, getattr(data, f"y_{split}"))
    classify = data.task == TASK_CLASSIFICATION
    loss_sum = score_sum = 0.0
    size = max(batch, 1024)
    for begin in range(0, len(x), size):
        out = np.asarray(model(x[begin : begin + size], training=False), dtype=np.float64)
        target = y[begin : begin + size]
        if classify:
            shifted = out - out.max(axis=-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            loss_sum -= float(np.take_along_axis(log_probs, target[:, None], axis=-1).sum())
            score_sum += float(np.sum(np.argmax(out, axis=-1) == target))
        else:
            loss_sum += float(np.sum((out - target) ** 2))
            score_sum += float(np.sum(np.abs(out - target)))
    n = max(len(x), 1)
    return {"loss": loss_sum / n, ("accuracy" if classify else "mae"): score_sum / n}
