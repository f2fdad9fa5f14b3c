"""What a trial trains on and how it is scored: the study's split, a refit,
or stratified k-fold cross-validation.

- By default a trial trains on the dataset's training split, reports the
  validation split after every epoch (what the tuner optimises) and records
  the test split's score with the model.
- ``options["refit"] == "true"`` (the tuner's refit of the best parameters
  once a study ends): the model trains on training + validation, the
  split's test score is its honest score. The validation metrics it still
  reports are on data it trained on, so a refit is never a candidate for the
  study's best (the tuner's rule).
- ``options["cv_folds"] = k``: the configuration is cross-validated over
  every example of the dataset (its training, validation and test splits
  together), in ``k`` stratified folds that depend only on the labels and
  ``options["cv_seed"]`` (0): the same folds for every configuration. The
  configuration is trained ``k`` times, each time on every fold but one and
  scored on that one, so every example is predicted exactly once. Such a
  trial chooses nothing and exports no model: its metrics are the mean over
  the held-out folds (``val_*`` and ``test_*`` alike) and each fold's
  (``fold_<i>_<metric>``). Progress steps run on through the folds (fold
  ``i``'s epoch ``e`` is step ``i * epochs + e``).
- ``options["cv_fold"] = i`` as well (the trainer puts a ``cv_fold`` trial
  parameter there): only fold ``i`` of those folds, so that a study whose
  trials are the folds (a grid over ``cv_fold``) spreads one
  cross-validation over every trainer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shared import splits
from shared.objective import is_refit
from svc_trainer.plan import (
    TASK_CLASSIFICATION,
    Channel,
    DataSplits,
    Runner,
    RunResult,
    RunSpec,
    StopReason,
    TrialError,
)

CV_FOLDS = "cv_folds"
CV_SEED = "cv_seed"
CV_FOLD = "cv_fold"
MAX_FOLDS = 50


def prepare(data: DataSplits, options: Mapping[str, str]) -> DataSplits:
    """The splits a trial with ``options`` trains on (before any folds)."""
    if cv_folds(options):
        return data
    if is_refit(options):
        return refit_splits(data)
    return data


def refit_splits(data: DataSplits) -> DataSplits:
    """Training + validation to train on, and their distribution; the test
    split unchanged."""
    return replace(
        data,
        x_train=np.concatenate([data.x_train, data.x_val]),
        y_train=np.concatenate([data.y_train, data.y_val]),
        distribution=data.train_val_distribution,
    )


def cv_folds(options: Mapping[str, str]) -> int:
    """The folds ``options`` asks for (0: no cross-validation); TrialError
    for a value that is not an integer in 2..MAX_FOLDS."""
    text = options.get(CV_FOLDS, "")
    if not text:
        return 0
    if not text.isdigit() or not 2 <= int(text) <= MAX_FOLDS:
        raise TrialError(
            f'options["{CV_FOLDS}"]={text!r}: expected an integer 2..{MAX_FOLDS}',
            reason="invalid_params",
        )
    return int(text)


def cv_fold(options: Mapping[str, str], folds: int) -> int | None:
    """The one fold ``options`` asks for, if any."""
    text = options.get(CV_FOLD, "")
    if not text:
        return None
    if not text.isdigit() or int(text) >= folds:
        raise TrialError(
            f'options["{CV_FOLD}"]={text!r}: expected a fold 0..{folds - 1}',
            reason="invalid_params",
        )
    return int(text)


def all_examples(data: DataSplits) -> tuple[NDArray[np.float32], NDArray[Any]]:
    """Every example of the dataset, splits in order (train, validation, test)."""
    return (
        np.concatenate([data.x_train, data.x_val, data.x_test]),
        np.concatenate([data.y_train, data.y_val, data.y_test]),
    )


def stratified_folds(y: NDArray[Any], folds: int, seed: int = 0) -> list[NDArray[np.intp]]:
    """``shared.splits.stratified_folds``: the held-out rows of each fold, the
    same for every trainer and for anything compared against them."""
    try:
        return splits.stratified_folds(y, folds, seed)
    except ValueError as exc:
        raise TrialError(str(exc), reason="invalid_params") from exc


def run(runner: Runner, spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
    """Run the trial: ``runner.run`` once, or once per fold (see the module
    docstring)."""
    folds = cv_folds(spec.options)
    if not folds:
        if CV_FOLD in spec.options:
            raise TrialError(
                f'a "{CV_FOLD}" needs options["{CV_FOLDS}"]: how many folds',
                reason="invalid_params",
            )
        return runner.run(spec, data, channel)
    if data.task != TASK_CLASSIFICATION:
        raise TrialError(
            f"cross-validation needs a classification dataset; {data.name!r} is "
            f"{data.task} (split chronologically)",
            reason="invalid_params",
        )
    seed = int(spec.options.get(CV_SEED, "0") or 0)
    only = cv_fold(spec.options, folds)
    x, y = all_examples(data)
    held_out = stratified_folds(y, folds, seed)
    every = np.arange(len(y))
    chosen = list(enumerate(held_out)) if only is None else [(only, held_out[only])]
    results: list[tuple[int, RunResult]] = []
    for position, (fold, test) in enumerate(chosen):
        train = np.setdiff1d(every, test, assume_unique=True)
        fold_data = replace(
            data,
            x_train=x[train],
            y_train=y[train],
            x_val=x[test],
            y_val=y[test],
            x_test=x[test],
            y_test=y[test],
        )
        fold_spec = replace(
            spec,
            checkpoint_dir=str(Path(spec.checkpoint_dir) / f"fold-{fold}"),
            export=False,
            seed=(spec.seed + position) % (2**31),
        )
        channel_of_fold = _FoldChannel(channel, position, fold, spec.epochs)
        result = runner.run(fold_spec, fold_data, channel_of_fold)
        if result.stopped is not StopReason.NONE:
            return replace(
                result,
                epochs_completed=position * spec.epochs + result.epochs_completed,
                test_metrics={},
            )
        results.append((fold, result))
    return _combined(results, spec.epochs)


def _combined(results: list[tuple[int, RunResult]], epochs: int) -> RunResult:
    def mean(values: list[float]) -> float:
        finite = [v for v in values if math.isfinite(v)]
        return float(np.mean(finite)) if finite else math.nan

    runs = [result for _, result in results]
    val = {
        name: mean([r.val_metrics.get(name, math.nan) for r in runs])
        for name in runs[0].val_metrics
    }
    test = {
        name: mean([r.test_metrics.get(name, math.nan) for r in runs])
        for name in runs[0].test_metrics
    }
    for fold, result in results:
        for name, value in result.test_metrics.items():
            test[f"fold_{fold}_{name.removeprefix('test_')}"] = value
    # The held-out folds are the validation of a cross-validation: the
    # objective (a val_ metric) is the cross-validated score.
    for name, value in list(test.items()):
        if name.startswith("test_"):
            val["val_" + name.removeprefix("test_")] = value
    return RunResult(epochs_completed=len(runs) * epochs, val_metrics=val, test_metrics=test)


class _FoldChannel:
    """One fold's view of the trial's channel: one ``started`` for the whole
    trial, steps numbered on through the folds."""

    def __init__(self, channel: Channel, position: int, fold: int, epochs: int) -> None:
        self._channel, self._position, self._fold = channel, position, fold
        self._epochs = epochs

    def started(self, resumed_from_step: int, note: str = "") -> None:
        if self._position == 0:
            self._channel.started(resumed_from_step, note)

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        self._channel.epoch(self._position * self._epochs + step, {**metrics, "fold": self._fold})

    def stop_requested(self) -> StopReason:
        return self._channel.stop_requested()
