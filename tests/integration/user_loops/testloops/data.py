"""A dataset loader of the user's: scikit-learn's iris as a pair for the platform to split."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sklearn.datasets import load_iris


def iris(options: Mapping[str, str]) -> tuple[Any, Any]:
    x, y = load_iris(return_X_y=True)
    names = load_iris().target_names
    return x, names[y]  # strings: the platform sorts them into classes
