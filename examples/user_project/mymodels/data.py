"""The example's data: two of scikit-learn's tables written as Parquet, as a
user's own data would be (``python -m mymodels.data [DIR]``).

- ``breast_cancer.parquet``: 569 tumours, 30 measurements each, and
  ``diagnosis`` ("malignant" or "benign"): a binary classification.
- ``wine.parquet``: 178 wines, 13 measurements each, and ``cultivar`` (0, 1
  or 2): a three-class classification.

``load`` is the same data through a loader of the project's own
(``task.dataset: "mymodels.data:load"``), for data no table holds.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path.home() / "aistack-example"


def write(directory: Path) -> list[Path]:
    """Write both tables into ``directory``; their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_breast_cancer, load_wine

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    cancer = load_breast_cancer()
    columns: dict[str, Any] = {
        name.replace(" ", "_"): cancer.data[:, i] for i, name in enumerate(cancer.feature_names)
    }
    columns["diagnosis"] = [str(cancer.target_names[t]) for t in cancer.target]
    written.append(directory / "breast_cancer.parquet")
    pq.write_table(pa.table(columns), written[-1])
    wine = load_wine()
    columns = {name: wine.data[:, i] for i, name in enumerate(wine.feature_names)}
    columns["cultivar"] = wine.target.astype("int64")
    written.append(directory / "wine.parquet")
    pq.write_table(pa.table(columns), written[-1])
    return written


def load(options: Mapping[str, str]) -> tuple[Any, Any]:
    """A loader: (x, y) of the breast-cancer table; the platform splits it."""
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    return x.astype("float32"), y


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR):
        print(path)
