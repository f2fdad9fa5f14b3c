"""The ``table`` dataset: a user's table (Parquet or CSV, a file, a
directory of files or a glob, local or any fsspec URL) with named feature
columns and a label column.

Options (``task.options``):

- ``path`` (required): ``/data/train.parquet``, ``s3://bucket/table/``,
  ``/data/part-*.csv``;
- ``format``: ``parquet`` or ``csv`` (default: from the files' extension);
- ``label`` (required): the column to predict;
- ``features``: the input columns, comma-separated, in the model's input
  order (default: every numeric column but the label and the split column);
- ``task``: ``classification`` or ``regression`` (default: a label of
  floats is a regression, of integers, strings or booleans a
  classification; its classes are its distinct values, sorted);
- ``split_column``: a column saying each row's split (``train``,
  ``val``/``validation``, ``test``); without it the rows are split at random
  with the study's seed, stratified by class for a classification:
  ``val_fraction`` (0.2) and ``test_fraction`` (0.2) of them;
- ``drop_missing``: ``true`` drops the rows with an empty feature or label
  (counted in the split's description); by default such a row is an error.

The version is a digest of the arrays, so it changes when the data does and
only then.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from svc_trainer.data.options import (
    BAD_DATASET,
    VERSION_CHARS,
    digest_arrays,
    fraction_option,
    stratified_split,
)
from svc_trainer.plan import TASK_CLASSIFICATION, TASK_REGRESSION, DataSplits, TrialError

NAME = "table"
#: The options the table dataset reads (``data.DATA_OPTIONS``).
OPTIONS = (
    "path",
    "format",
    "label",
    "features",
    "task",
    "split_column",
    "val_fraction",
    "test_fraction",
    "drop_missing",
)
FORMATS = ("parquet", "csv")
VAL_FRACTION = 0.2
TEST_FRACTION = 0.2
_SPLIT_NAMES = {"train": "train", "val": "val", "validation": "val", "test": "test"}


def load_table(options: Mapping[str, str], seed: int) -> DataSplits:
    """The table's splits. Raises TrialError (``bad_dataset``) naming what
    is wrong: no path or label, unreadable files, unknown or non-numeric
    columns, empty cells, a split column with other values, too few rows."""
    path = options.get("path", "")
    label = options.get("label", "")
    if not path:
        raise TrialError('dataset "table" needs options["path"]', reason=BAD_DATASET)
    if not label:
        raise TrialError(
            'dataset "table" needs options["label"]: the column to predict', reason=BAD_DATASET
        )
    dataset = open_table(path, options.get("format", ""))
    names = list(dataset.schema.names)
    split_column = options.get("split_column", "")
    for column in (label, split_column):
        if column and column not in names:
            raise TrialError(f"{path} has no column {column!r}; it has {names}", reason=BAD_DATASET)
    features = _feature_columns(dataset.schema, options.get("features", ""), label, split_column)
    columns = [*features, label, *([split_column] if split_column else [])]
    try:
        table = dataset.to_table(columns=columns)
    except (OSError, ValueError) as exc:
        raise TrialError(f"cannot read {path}: {exc}", reason=BAD_DATASET) from exc
    table, dropped = _missing(table, [*features, label], options.get("drop_missing", ""), path)
    x = np.column_stack([_floats(table[name], name) for name in features]).astype(np.float32)
    task = _task(options.get("task", ""), table.schema.field(label).type)
    y, n_classes, class_names = _labels(table[label], task, path, label)
    if split_column:
        train, val, test = _column_split(table[split_column], path, split_column)
        how = f"split by column {split_column!r}"
    else:
        val_fraction = fraction_option(options, "val_fraction", VAL_FRACTION)
        test_fraction = fraction_option(options, "test_fraction", TEST_FRACTION)
        train, val, test = _random_split(y, task, val_fraction, test_fraction, seed)
        percents = [round(100 * (1 - val_fraction - test_fraction)), round(100 * val_fraction)]
        percents.append(100 - sum(percents))
        kind = "stratified" if task == TASK_CLASSIFICATION else "random"
        how = f"{kind} {'/'.join(map(str, percents))}, seed {seed}"
    if dropped:
        how += f"; {dropped} rows with empty cells dropped"
    if not (len(train) and len(val)):
        raise TrialError(
            f"{path}: {len(train)} training and {len(val)} validation rows; both must be non-empty",
            reason=BAD_DATASET,
        )
    arrays = (x[train], y[train], x[val], y[val], x[test], y[test])
    identity = "|".join([*features, label, how, *class_names]).encode()
    version = hashlib.sha256(identity + digest_arrays(*arrays).encode()).hexdigest()
    return DataSplits(
        name=NAME,
        version=version[:VERSION_CHARS],
        task=task,
        x_train=arrays[0],
        y_train=arrays[1],
        x_val=arrays[2],
        y_val=arrays[3],
        x_test=arrays[4],
        y_test=arrays[5],
        n_classes=n_classes,
        source=path,
        files=_urls(path, dataset.files),
        feature_names=tuple(features),
        label=label,
        class_names=class_names,
        split=how,
    )


def open_table(path: str, fmt: str) -> Any:
    """A ``pyarrow.dataset`` over the file, directory or glob at ``path``."""
    import pyarrow.dataset as ds

    from shared import object_store

    fs, located, listed = _locate(path)
    filesystem = object_store.arrow_filesystem(fs)
    chosen = fmt or _format_of(listed or [located], path)
    if chosen not in FORMATS:
        raise TrialError(
            f'options["format"]={chosen!r}: expected one of {", ".join(FORMATS)}',
            reason=BAD_DATASET,
        )
    source: Any = listed if listed else located
    try:
        return ds.dataset(source, format=chosen, filesystem=filesystem)
    except (OSError, ValueError) as exc:
        raise TrialError(f"cannot read the table {path}: {exc}", reason=BAD_DATASET) from exc


def fingerprint(path: str) -> str:
    """Changes when a file of the table is added, removed or rewritten
    (local: sizes and times; elsewhere: the filesystem's own key of each)."""
    try:
        filesystem, located, listed = _locate(path)
        digest = hashlib.sha256()
        for name in listed or [located]:
            digest.update(f"{name}|{filesystem.ukey(name)}\n".encode())
        return digest.hexdigest()[:VERSION_CHARS]
    except TrialError:
        return "missing"


def _locate(path: str) -> tuple[Any, str, list[str]]:
    """(fsspec filesystem, path on it, the files when ``path`` is a glob or
    a directory): the URL's filesystem, the local one for a path."""
    from shared import object_store
    from shared.errors import FailedPrecondition

    try:
        # A trial's process: the trainer's settings reach it as its environment.
        fs, located = object_store.filesystem(path)
    except FailedPrecondition as exc:
        raise TrialError(f"table {path}: {exc}", reason=BAD_DATASET) from exc
    if any(c in located for c in "*?["):
        listed = sorted(str(p) for p in fs.glob(located))
    elif fs.isdir(located):
        listed = sorted(
            str(p)
            for p in fs.find(located)
            if str(p).endswith((".parquet", ".csv", ".csv.gz")) and "/." not in str(p)
        )
    elif fs.exists(located):
        listed = []
    else:
        raise TrialError(f"table {path} does not exist", reason=BAD_DATASET)
    if (listed == [] and fs.isdir(located)) or (any(c in located for c in "*?[") and not listed):
        raise TrialError(f"table {path} holds no .parquet or .csv files", reason=BAD_DATASET)
    return fs, located, listed


def _urls(path: str, files: Sequence[str]) -> tuple[str, ...]:
    """The files as the lineage names them: absolute paths, or URLs."""
    fs, _, _ = _locate(path)
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        return tuple(files)
    return tuple(fs.unstrip_protocol(name) for name in files)


def _format_of(files: Sequence[str], path: str) -> str:
    kinds = {"csv" if f.endswith((".csv", ".csv.gz")) else "parquet" for f in files}
    if len(kinds) > 1:
        raise TrialError(
            f"table {path} mixes CSV and Parquet files: set options['format']",
            reason=BAD_DATASET,
        )
    return kinds.pop()


def _feature_columns(schema: Any, listed: str, label: str, split_column: str) -> list[str]:
    import pyarrow.types as pat

    names = list(schema.names)
    if listed:
        features = [name.strip() for name in listed.split(",") if name.strip()]
        unknown = [name for name in features if name not in names]
        if unknown:
            raise TrialError(
                f"options['features'] names {unknown}, not columns of the table: {names}",
                reason=BAD_DATASET,
            )
        if label in features:
            raise TrialError(f"the label {label!r} is among the features", reason=BAD_DATASET)
    else:
        features = [
            name
            for name in names
            if name not in (label, split_column) and _numeric(schema.field(name).type, pat)
        ]
        if not features:
            raise TrialError(
                f"the table has no numeric column besides the label {label!r}: name the "
                "features in options['features']",
                reason=BAD_DATASET,
            )
    wrong = [name for name in features if not _numeric(schema.field(name).type, pat)]
    if wrong:
        kinds = {name: str(schema.field(name).type) for name in wrong}
        raise TrialError(
            f"feature columns must be numbers or booleans; {kinds} are not", reason=BAD_DATASET
        )
    return features


def _numeric(kind: Any, pat: Any) -> bool:
    return bool(pat.is_integer(kind) or pat.is_floating(kind) or pat.is_boolean(kind))


def _missing(table: Any, columns: list[str], drop: str, path: str) -> tuple[Any, int]:
    import pyarrow.compute as pc

    empty = None
    for name in columns:
        column = table[name]
        missing = pc.is_null(column, nan_is_null=True)
        empty = missing if empty is None else pc.or_(empty, missing)
    count = int(pc.sum(empty).as_py() or 0) if empty is not None else 0
    if not count:
        return table, 0
    if drop.lower() != "true":
        raise TrialError(
            f"{path}: {count} rows have an empty feature or label; fill them, or set "
            "options['drop_missing'] to true",
            reason=BAD_DATASET,
        )
    return table.filter(pc.invert(empty)), count


def _floats(column: Any, name: str) -> NDArray[np.float64]:
    import pyarrow as pa

    return np.asarray(column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def _task(given: str, kind: Any) -> str:
    import pyarrow.types as pat

    if given:
        if given not in (TASK_CLASSIFICATION, TASK_REGRESSION):
            raise TrialError(
                f"options['task']={given!r}: expected classification or regression",
                reason=BAD_DATASET,
            )
        return given
    return TASK_REGRESSION if pat.is_floating(kind) else TASK_CLASSIFICATION


def _labels(
    column: Any, task: str, path: str, label: str
) -> tuple[NDArray[Any], int, tuple[str, ...]]:
    import pyarrow as pa

    if task == TASK_REGRESSION:
        try:
            values = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TrialError(
                f"{path}: the label {label!r} is not numeric, so it cannot be regressed on",
                reason=BAD_DATASET,
            ) from exc
        return np.asarray(values, dtype=np.float32), 0, ()
    raw = column.to_pylist()
    classes = sorted(set(raw), key=lambda value: (str(type(value)), value))
    if len(classes) < 2:
        raise TrialError(
            f"{path}: the label {label!r} has {len(classes)} distinct value(s); a "
            "classification needs at least 2",
            reason=BAD_DATASET,
        )
    index = {value: i for i, value in enumerate(classes)}
    y = np.fromiter((index[value] for value in raw), dtype=np.int64, count=len(raw))
    return y, len(classes), tuple(str(value) for value in classes)


def _column_split(
    column: Any, path: str, name: str
) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp]]:
    values = [str(v).strip().lower() for v in column.to_pylist()]
    unknown = sorted({v for v in values if v not in _SPLIT_NAMES})
    if unknown:
        raise TrialError(
            f"{path}: split column {name!r} holds {unknown[:5]}; expected train, val "
            "(or validation) and test",
            reason=BAD_DATASET,
        )
    named = np.asarray([_SPLIT_NAMES[v] for v in values])
    return tuple(np.flatnonzero(named == part) for part in ("train", "val", "test"))  # type: ignore[return-value]


def _random_split(
    y: NDArray[Any], task: str, val_fraction: float, test_fraction: float, seed: int
) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp]]:
    if task == TASK_CLASSIFICATION:
        return stratified_split(y, val_fraction, test_fraction, seed)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test, n_val = round(test_fraction * len(y)), round(val_fraction * len(y))
    if len(y) - n_test - n_val < 1 or n_val < 1:
        raise TrialError(
            f"{len(y)} rows are too few for a {val_fraction:g} validation and "
            f"{test_fraction:g} test split",
            reason=BAD_DATASET,
        )
    test = np.sort(order[:n_test])
    val = np.sort(order[n_test : n_test + n_val])
    return np.sort(order[n_test + n_val :]), val, test
