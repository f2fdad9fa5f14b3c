"""A dataset loader of the user's: ``task.dataset: "package.module:function"``.

The function is called with the task's options (a mapping of strings) and
returns either

- an ``aistack.Dataset``: the splits as the user made them, or
- a pair ``(x, y)`` of arrays: the platform splits the rows with the study's
  seed (stratified 60/20/20 for a classification, random for a regression).
  ``y`` of integers, strings or booleans is a classification, of floats a
  regression; ``options["task"]`` says otherwise.

An executor calls it once for the same options and keeps what it returned
(``data.cache_key``): a loader is a function of its options. What it does
wrong fails the study: every trial would load the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from aistack.trial import Dataset
from svc_trainer.data.options import (
    BAD_DATASET,
    VERSION_CHARS,
    digest_arrays,
    stratified_split,
)
from svc_trainer.plan import TASK_CLASSIFICATION, TASK_REGRESSION, DataSplits, TrialError
from svc_trainer.user_code import failures
from svc_trainer.user_code.imports import resolve

VAL_FRACTION = TEST_FRACTION = 0.2


def load_with(ref: str, options: Mapping[str, str], seed: int) -> DataSplits:
    """The splits of what the loader ``ref`` returns; TrialError, fatal to
    the study, for a loader that cannot be imported, raises, or returns
    something else."""
    loader = resolve(ref, "task.dataset")
    try:
        loaded = loader(dict(options))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        error = failures.from_exception(exc, f"dataset loader {ref!r}")
        error.fatal_to_study = True
        raise error from exc
    if isinstance(loaded, Dataset):
        return _given(ref, loaded)
    if isinstance(loaded, tuple) and len(loaded) == 2:
        return _split(ref, np.asarray(loaded[0]), np.asarray(loaded[1]), options, seed)
    raise TrialError(
        f"dataset loader {ref!r} returned a {type(loaded).__name__}: expected an "
        "aistack.Dataset or a pair (x, y)",
        reason=BAD_DATASET,
        fatal_to_study=True,
    )


def _given(ref: str, data: Dataset) -> DataSplits:
    if data.task not in (TASK_CLASSIFICATION, TASK_REGRESSION):
        raise TrialError(
            f"dataset loader {ref!r}: task {data.task!r}, expected classification or regression",
            reason=BAD_DATASET,
            fatal_to_study=True,
        )
    classify = data.task == TASK_CLASSIFICATION
    arrays: list[Any] = [
        np.asarray(a, dtype=np.float32 if name.startswith("x") or not classify else np.int64)
        for name, a in (
            ("x", data.x_train),
            ("y", data.y_train),
            ("x", data.x_val),
            ("y", data.y_val),
            ("x", data.x_test),
            ("y", data.y_test),
        )
    ]
    n_classes = data.n_classes
    if classify and not n_classes:
        n_classes = int(max(int(arrays[i].max(initial=0)) for i in (1, 3, 5))) + 1
    return DataSplits(
        name=ref,
        version=data.version or digest_arrays(*arrays),
        task=data.task,
        x_train=arrays[0],
        y_train=arrays[1],
        x_val=arrays[2],
        y_val=arrays[3],
        x_test=arrays[4],
        y_test=arrays[5],
        n_classes=n_classes,
        source=ref,
        feature_names=tuple(data.feature_names),
        label=data.label,
        class_names=tuple(data.class_names),
        split=f"as {ref} split it",
    )


def _split(ref: str, x: Any, y: Any, options: Mapping[str, str], seed: int) -> DataSplits:
    if len(x) != len(y) or not len(y):
        raise TrialError(
            f"dataset loader {ref!r} returned {len(x)} inputs and {len(y)} targets",
            reason=BAD_DATASET,
            fatal_to_study=True,
        )
    task = options.get("task") or (
        TASK_REGRESSION if np.issubdtype(y.dtype, np.floating) else TASK_CLASSIFICATION
    )
    class_names: tuple[str, ...] = ()
    if task == TASK_CLASSIFICATION:
        classes, targets = np.unique(y, return_inverse=True)
        class_names = tuple(str(c) for c in classes)
        y = targets.astype(np.int64).reshape(-1)
        train, val, test = stratified_split(y, VAL_FRACTION, TEST_FRACTION, seed)
        how = f"stratified 60/20/20, seed {seed}"
    else:
        y = y.astype(np.float32).reshape(-1)
        order = np.random.default_rng(seed).permutation(len(y))
        n = round(VAL_FRACTION * len(y))
        test, val, train = (np.sort(order[:n]), np.sort(order[n : 2 * n]), np.sort(order[2 * n :]))
        how = f"random 60/20/20, seed {seed}"
    x = x.astype(np.float32)
    arrays = (x[train], y[train], x[val], y[val], x[test], y[test])
    version = hashlib.sha256((how + digest_arrays(*arrays)).encode()).hexdigest()
    return DataSplits(
        name=ref,
        version=version[:VERSION_CHARS],
        task=task,
        x_train=arrays[0],
        y_train=arrays[1],
        x_val=arrays[2],
        y_val=arrays[3],
        x_test=arrays[4],
        y_test=arrays[5],
        n_classes=len(class_names),
        source=ref,
        class_names=class_names,
        split=how,
    )
