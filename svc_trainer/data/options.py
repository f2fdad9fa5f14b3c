"""What every dataset shares: the error reason for bad data, the length of a
data version and how it is computed from the arrays, how a dataset's string
options are parsed, and the seeded stratified split (``shared.splits``'s rule)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shared import splits
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
    """``shared.splits.stratified_split``; too few rows for the split is bad data."""
    try:
        return splits.stratified_split(y, val_fraction, test_fraction, seed)
    except ValueError as exc:
        raise TrialError(str(exc), reason=BAD_DATASET) from exc


def digest_arrays(*arrays: NDArray[Any]) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:VERSION_CHARS]
