"""How examples are split and folded: seeded, stratified, the same on every
side. The trainers split and fold their data with these, and anything that
compares against a trainer's cross-validation (the demo's SVC baseline) folds
the same examples the same way by calling them too.

Pure numpy functions of the labels and the seed. A request they cannot meet
raises ValueError; the trainer turns it into its own trial error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray


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
        raise ValueError(
            f"{len(y)} examples are too few for a {val_fraction:.3g} validation "
            f"and {test_fraction:.3g} test split"
        )
    test = np.sort(order[:n_test])
    val = np.sort(order[n_test : n_test + n_val])
    train = np.sort(order[n_test + n_val :])
    return train, val, test


def stratified_folds(y: NDArray[Any], folds: int, seed: int = 0) -> list[NDArray[np.intp]]:
    """The held-out row indices of each fold, ascending. Every row is in
    exactly one fold; each class is dealt round-robin over the folds (after a
    seeded shuffle), so every fold holds each class to within one row and the
    fold sizes differ by at most one."""
    if not 2 <= folds <= len(y):
        raise ValueError(f"{folds} folds for {len(y)} examples: expected 2..{len(y)}")
    rng = np.random.default_rng(seed)
    members: list[list[int]] = [[] for _ in range(folds)]
    dealt = 0
    for label in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == label))
        for position, row in enumerate(rows):
            members[(dealt + position) % folds].append(int(row))
        # The next class continues the deal, so fold sizes stay within one.
        dealt += len(rows)
    return [np.sort(np.asarray(rows, dtype=np.intp)) for rows in members]


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
