"""What every dataset shares: the error reason for bad data, the length of a
data version and how it is computed from the arrays, how a dataset's string
options are parsed, and the seeded stratified split."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from svc_trainer.plan import TrialError

BAD_DATASET = "bad_dataset"
#: Hex characters of a dataset's version (a sha256 prefix).
VERSION_CHARS = 16


def int_option(options: Mapping[str, str], name: str, *, default: int, minimum: int) -> int:
    """``options[name]`` as an integer >= ``minimum``; ``default`` when absent or empty."""
    text = options.get(name, "")
    if not text:
        return default
    try:
        value = int(text)
    except ValueError as exc:
        raise TrialError(
            f'options["{name}"]={text!r}: expected an integer', reason=BAD_DATASET
        ) from exc
    if value < minimum:
        raise TrialError(f'options["{name}"]={value}: expected >= {minimum}', reason=BAD_DATASET)
    return value


def fraction_option(options: Mapping[str, str], name: str, default: float) -> float:
    """``options[name]`` as a number strictly between 0 and 1; ``default`` when absent or empty."""
    text = options.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError as exc:
        raise TrialError(
            f'options["{name}"]={text!r}: expected a number', reason=BAD_DATASET
        ) from exc
    if not 0 < value < 1:
        raise TrialError(f'options["{name}"]={value}: expected 0 < value < 1', reason=BAD_DATASET)
    return value


def stratified_split(
    y: NDArray[Any], val_fraction: float, test_fraction: float, seed: int
) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp]]:
    """Row indices (train, validation, test), each ascending, covering every row once.

    The validation and test splits hold round(fraction * N) rows, and every
    class is spread over the splits in proportion, to within a row or two. Only
    ``seed`` decides which rows of a class go where.
    """
    order = _stratified_order(y, seed)
    n_test = round(test_fraction * len(y))
    n_val = round(val_fraction * len(y))
    if len(y) - n_test - n_val < 1 or (val_fraction > 0 and n_val < 1):
        raise TrialError(
            f"{len(y)} examples are too few for a {val_fraction:.3g} validation "
            f"and {test_fraction:.3g} test split",
            reason=BAD_DATASET,
        )
    test = np.sort(order[:n_test])
    val = np.sort(order[n_test : n_test + n_val])
    train = np.sort(order[n_test + n_val :])
    return train, val, test


def _stratified_order(y: NDArray[Any], seed: int) -> NDArray[np.intp]:
    """All row indices so that every prefix holds each class in proportion.

    Each row's key is its (random) rank within its class over the class's
    size: taking the rows with the smallest keys takes the same share of
    every class.
    """
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(len(y))
    by_class = shuffled[np.argsort(y[shuffled], kind="stable")]
    _, starts, counts = np.unique(y[by_class], return_index=True, return_counts=True)
    class_of = np.repeat(np.arange(len(counts)), counts)
    rank = np.arange(len(y)) - starts[class_of]
    key = np.empty(len(y), dtype=np.float64)
    key[by_class] = (rank + 0.5) / counts[class_of]
    tiebreak = rng.random(len(y))
    return np.lexsort((tiebreak, key))


def digest_arrays(*arrays: NDArray[Any]) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:VERSION_CHARS]
