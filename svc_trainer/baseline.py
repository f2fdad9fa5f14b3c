"""A trial's baseline: the model its model is measured against
(``task.baseline``, a re-tune's serving version), on the trial's own
validation split.

The baseline is loaded the way the model server loads models
(``shared.model_loading``: a private copy whose sha256 matches its event,
then the framework's loader) and scored the way the runners score theirs
(``plan.regression_metrics`` / ``plan.classification_metrics`` over the
validation split), so its value and the trial's compare data for data. Its
value of the objective is reported as ``shared.objective.baseline_metric``
of the objective. A baseline that cannot be fetched, loaded or run on the
data fails the trial (``BAD_BASELINE``, not retryable): a missing value
would let the challenger win unopposed.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format
from numpy.typing import NDArray

from shared import model_loading
from shared.contracts.aistack.v1 import models_pb2
from shared.objective import baseline_metric
from svc_trainer.plan import (
    TASK_CLASSIFICATION,
    DataSplits,
    RunSpec,
    TrialError,
    classification_metrics,
    regression_metrics,
)

BAD_BASELINE = "bad_baseline"
#: Rows per call of the baseline: bounded memory on a large validation split.
CHUNK_ROWS = 4096
# The probability a log-loss treats as the least possible: a confident miss
# costs about 690 nats, not infinity.
_TINY = 1e-300


def scores(outputs: NDArray[Any], y: NDArray[Any], task: str) -> dict[str, float]:
    """The ``val_`` metrics of a served model's ``outputs`` for targets ``y``,
    named and computed as the runners compute theirs. Regression: the mean
    squared error (``val_loss``, ``val_mse``), its root and the mean absolute
    error of the prediction. Classification: the mean cross-entropy of the
    probabilities (the runners' loss from the logits: the same value), the
    accuracy and error of their argmax."""
    if task == TASK_CLASSIFICATION:
        probabilities = np.asarray(outputs, dtype=np.float64).reshape(len(y), -1)
        labels = np.asarray(y, dtype=np.int64)
        picked = np.take_along_axis(probabilities, labels[:, None], axis=1)[:, 0]
        loss = float(-np.mean(np.log(np.maximum(picked, _TINY))))
        accuracy = float(np.mean(np.argmax(probabilities, axis=1) == labels))
        metrics = classification_metrics(math.nan, loss, accuracy)
    else:
        error = np.asarray(outputs, dtype=np.float64).reshape(len(y)) - np.asarray(
            y, dtype=np.float64
        )
        metrics = regression_metrics(
            math.nan, float(np.mean(error**2)), float(np.mean(np.abs(error)))
        )
    return {name: value for name, value in metrics.items() if name.startswith("val_")}


def predict(model: model_loading.Runner, x: NDArray[Any]) -> NDArray[Any]:
    """The model's first output for every row of ``x``. Raises TrialError
    (without a subject; ``measure`` names the baseline) when the model does
    not take one input of ``x``'s shape or fails on it."""
    if len(model.inputs) != 1 or not model.outputs:
        raise TrialError(
            f"it takes {len(model.inputs)} inputs and gives {len(model.outputs)} outputs; "
            "the trial's data is one input, scored by one output",
            reason=BAD_BASELINE,
        )
    sig = model.inputs[0]
    wanted = tuple(sig.shape[1:])
    given = tuple(x.shape[1:])
    if len(wanted) != len(given) or any(
        w not in (-1, g) for w, g in zip(wanted, given, strict=True)
    ):
        raise TrialError(
            f"its input {sig.name!r} is {list(sig.shape)} but the trial's examples are "
            f"{list(given)}: it reads other features",
            reason=BAD_BASELINE,
        )
    dtype = model_loading.NUMPY_TYPES.get(sig.datatype)
    if dtype is None:
        raise TrialError(f"its input {sig.name!r} is {sig.datatype}", reason=BAD_BASELINE)
    out_name = model.outputs[0].name
    parts = []
    for begin in range(0, len(x), CHUNK_ROWS):
        chunk = np.ascontiguousarray(x[begin : begin + CHUNK_ROWS], dtype=dtype)
        try:
            out = model.run({sig.name: chunk})[out_name]
        except Exception as exc:  # whatever the framework raises
            raise TrialError(
                f"it fails on the validation split: {type(exc).__name__}: {exc}",
                reason=BAD_BASELINE,
            ) from exc
        parts.append(np.asarray(out))
    return np.concatenate(parts)


def measure(
    model: model_loading.Runner,
    data: DataSplits,
    metric: str,
    *,
    named: str,
) -> dict[str, float]:
    """``{baseline_metric(metric): value}``: the baseline's ``metric`` on
    ``data``'s validation split. Raises TrialError(reason="bad_baseline")
    whose message begins with ``named`` (which baseline) when it cannot be had."""
    try:
        outputs = predict(model, data.x_val)
        if data.task == TASK_CLASSIFICATION:
            width = outputs.reshape(len(data.y_val), -1).shape[1]
            if len(data.y_val) and width <= int(np.max(data.y_val)):
                raise TrialError(
                    f"it gives {width} probabilities but the labels go up to "
                    f"{int(np.max(data.y_val))}",
                    reason=BAD_BASELINE,
                )
        elif outputs.size != len(data.y_val):
            raise TrialError(
                f"it gives {outputs.size} values for {len(data.y_val)} examples",
                reason=BAD_BASELINE,
            )
        value = scores(outputs, data.y_val, data.task).get(metric)
        if value is None:
            raise TrialError(f"a {data.task} model has no {metric!r}", reason=BAD_BASELINE)
    except TrialError as exc:
        raise TrialError(f"{named}: {exc.message}", reason=exc.reason) from exc
    return {baseline_metric(metric): value}


def evaluate(spec: RunSpec, data: DataSplits) -> dict[str, float]:
    """The baseline's value of the trial's objective on ``data``'s validation
    split (``measure``), fetched into ``spec.baseline_dir`` and checked
    against its sha256; {} when the trial names no baseline. Raises
    TrialError(reason="bad_baseline") for a baseline that cannot be fetched,
    verified, loaded or run on the data."""
    if not spec.baseline:
        return {}
    event = json_format.Parse(spec.baseline, models_pb2.ModelReady())
    named = f"baseline {event.model_name or '?'} version {event.version or '?'}"
    with _cache(spec.baseline_dir) as cache:
        try:
            directory = model_loading.fetch(event, cache)
            model = model_loading.load(event, directory)
        except model_loading.ArtifactRejected as exc:
            raise TrialError(
                f"{named} cannot be loaded ({exc.reason}): {exc.message}", reason=BAD_BASELINE
            ) from exc
        return measure(model, data, spec.objective_metric, named=named)


@contextmanager
def _cache(directory: str) -> Iterator[Path]:
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        yield Path(directory)
        return
    with tempfile.TemporaryDirectory(prefix="aistack-baseline-") as scratch:
        yield Path(scratch)
