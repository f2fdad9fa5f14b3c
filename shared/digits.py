"""The ``digits`` dataset as the trainers split it: scikit-learn's 8x8 digits,
scaled to [0, 1], in a seeded stratified 60/20/20 split (``shared.splits``).

The trainers train on it by this name; the demo serves its held-out digits and
compares an SVC on the same examples, in the same order, as the trainers'
cross-validation folds. One loader, so both sides always see the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shared.splits import stratified_split

VAL_FRACTION = 0.2
TEST_FRACTION = 0.2
CLASSES = 10


@dataclass(frozen=True)
class Digits:
    """Every example (``x``: (N, 8, 8) float32 in [0, 1]; ``y``: int64 labels)
    and the row indices of each split."""

    x: NDArray[np.float32]
    y: NDArray[np.int64]
    train: NDArray[np.intp]
    val: NDArray[np.intp]
    test: NDArray[np.intp]
    source: str
    split: str

    def in_split_order(self) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        """Every example, the splits in order (train, validation, test): the
        order in which the trainers' cross-validation folds them."""
        rows = np.concatenate([self.train, self.val, self.test])
        return self.x[rows], self.y[rows]


def load(seed: int = 0) -> Digits:
    # Imported here: scikit-learn takes a second to import.
    import sklearn
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float64) / 16.0).astype(np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    train, val, test = stratified_split(y, VAL_FRACTION, TEST_FRACTION, seed)
    return Digits(
        x,
        y,
        train,
        val,
        test,
        source=f"sklearn digits {sklearn.__version__}",
        split=f"stratified 60/20/20, seed {seed}",
    )
