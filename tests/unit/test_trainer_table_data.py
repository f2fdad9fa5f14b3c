"""The ``table`` dataset (``svc_trainer.data.tables``): a user's Parquet or
CSV table, by file, directory, glob or fsspec URL, named columns, a label,
classification or regression, seeded or column splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from svc_trainer.data import datasets
from svc_trainer.plan import TASK_CLASSIFICATION, TASK_REGRESSION, DataSplits, TrialError


def table(rows: int = 100, *, missing: int = 0) -> pa.Table:
    rng = np.random.default_rng(1)
    a = rng.normal(size=rows)
    b = rng.integers(0, 10, size=rows)
    a_values: list[float | None] = list(a)
    for i in range(missing):
        a_values[i] = None
    return pa.table(
        {
            "a": pa.array(a_values, pa.float64()),
            "b": b,
            "flag": rng.random(rows) > 0.5,
            "name": [f"row{i}" for i in range(rows)],
            "kind": ["cat" if v > 0 else "dog" for v in a],
            "price": a * 3.0 + b,
            "part": ["train"] * (rows - 20) + ["val"] * 10 + ["test"] * 10,
        }
    )


def load(path: Path | str, **options: str) -> DataSplits:
    return datasets.load("table", {"path": str(path), **options}, seed=0)


def test_a_parquet_classification_reads_its_numeric_features_and_string_classes(
    tmp_path: Path,
) -> None:
    pq.write_table(table(), tmp_path / "t.parquet")
    data = load(tmp_path / "t.parquet", label="kind")
    assert data.task == TASK_CLASSIFICATION and data.class_names == ("cat", "dog")
    # Strings are no features; the label is not one either.
    assert data.feature_names == ("a", "b", "flag", "price")
    assert data.x_train.dtype == np.float32 and data.x_train.shape[1] == 4
    assert len(data.y_train) + len(data.y_val) + len(data.y_test) == 100
    assert (len(data.y_val), len(data.y_test)) == (20, 20)
    assert data.split == "stratified 60/20/20, seed 0"
    assert data.files == (str(tmp_path / "t.parquet"),)
    assert load(tmp_path / "t.parquet", label="kind").version == data.version
    other = datasets.load("table", {"path": str(tmp_path / "t.parquet"), "label": "kind"}, seed=3)
    assert other.version != data.version


def test_a_float_label_is_a_regression_and_named_features_keep_their_order(
    tmp_path: Path,
) -> None:
    pq.write_table(table(), tmp_path / "t.parquet")
    data = load(tmp_path / "t.parquet", label="price", features="b, a")
    assert data.task == TASK_REGRESSION and data.y_train.dtype == np.float32
    assert data.feature_names == ("b", "a")
    assert data.split.startswith("random 60/20/20")
    forced = load(tmp_path / "t.parquet", label="b", task="regression")
    assert forced.task == TASK_REGRESSION


def test_csv_files_under_a_directory_and_a_glob_read_as_one_table(tmp_path: Path) -> None:
    whole = table()
    (tmp_path / "csv").mkdir()
    pacsv.write_csv(whole.slice(0, 50), tmp_path / "csv" / "part-0.csv")
    pacsv.write_csv(whole.slice(50), tmp_path / "csv" / "part-1.csv")
    by_dir = load(tmp_path / "csv", label="kind")
    by_glob = load(f"{tmp_path}/csv/part-*.csv", label="kind", format="csv")
    assert len(by_dir.files) == 2 and by_dir.version == by_glob.version
    assert len(by_dir.y_train) + len(by_dir.y_val) + len(by_dir.y_test) == 100


def test_a_split_column_decides_the_splits(tmp_path: Path) -> None:
    pq.write_table(table(), tmp_path / "t.parquet")
    data = load(tmp_path / "t.parquet", label="kind", split_column="part")
    assert (len(data.y_train), len(data.y_val), len(data.y_test)) == (80, 10, 10)
    assert "part" not in data.feature_names and data.split == "split by column 'part'"


def test_empty_cells_are_refused_unless_dropped(tmp_path: Path) -> None:
    pq.write_table(table(missing=5), tmp_path / "t.parquet")
    with pytest.raises(TrialError, match="5 rows have an empty feature"):
        load(tmp_path / "t.parquet", label="kind")
    data = load(tmp_path / "t.parquet", label="kind", drop_missing="true")
    assert len(data.y_train) + len(data.y_val) + len(data.y_test) == 95
    assert "5 rows with empty cells dropped" in data.split


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({}, "the column to predict"),
        ({"label": "nope"}, "no column 'nope'"),
        ({"label": "kind", "features": "a,zz"}, "not columns of the table"),
        ({"label": "kind", "features": "a,name"}, "must be numbers"),
        ({"label": "kind", "features": "a,kind"}, "is among the features"),
        ({"label": "kind", "task": "ranking"}, "expected classification or regression"),
        ({"label": "name", "split_column": "kind"}, "expected train, val"),
        ({"label": "kind", "format": "xlsx"}, "expected one of parquet, csv"),
    ],
)
def test_a_table_that_cannot_be_read_as_asked_says_why(
    tmp_path: Path, options: dict[str, str], said: str
) -> None:
    pq.write_table(table(), tmp_path / "t.parquet")
    with pytest.raises(TrialError, match=said) as raised:
        load(tmp_path / "t.parquet", **options)
    assert raised.value.reason == "bad_dataset"


def test_a_missing_table_is_named(tmp_path: Path) -> None:
    with pytest.raises(TrialError, match="does not exist"):
        load(tmp_path / "none.parquet", label="x")


def test_the_cache_key_follows_the_tables_files(tmp_path: Path) -> None:
    pq.write_table(table(), tmp_path / "t.parquet")
    options = {"path": str(tmp_path / "t.parquet"), "label": "kind"}
    key = datasets.cache_key("table", options)
    assert datasets.cache_key("table", {**options, "refit": "true"}) == key
    assert datasets.cache_key("table", {**options, "label": "b"}) != key
    pq.write_table(table(rows=120), tmp_path / "t.parquet")
    assert datasets.cache_key("table", options) != key


def test_a_table_on_another_filesystem_reads_through_fsspec(tmp_path: Path) -> None:
    import fsspec

    memory = fsspec.filesystem("memory")
    with memory.open("/tables/t.parquet", "wb") as handle:
        pq.write_table(table(), handle)
    data = load("memory://tables/t.parquet", label="kind")
    assert data.files == (memory.unstrip_protocol("/tables/t.parquet"),)
    assert len(data.y_train) == 60
