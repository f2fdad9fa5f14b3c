"""The trainer's datasets, in fixed, seeded train/validation/test splits.

``load(dataset, options, seed=..., features_path=...)`` knows three datasets:

* ``digits``: scikit-learn's 8x8 digits (shipped with scikit-learn, no download).
* ``mnist``: the four standard IDX files in ``options["path"]``.
* ``features``: next-window forecasting on svc_transform's Parquet offline store.

Every split is a pure function of the files, the options and the seed: the
same inputs give byte-identical arrays, and the seed only changes which rows
go where (``features`` is chronological and ignores it). Problems with the data
or its options raise ``TrialError(reason="bad_dataset")``; the tuner does not
retry them.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from svc_trainer.idx import read_idx
from svc_trainer.plan import TASK_CLASSIFICATION, TASK_REGRESSION, DataSplits, TrialError

DATASETS = ("digits", "mnist", "features")
BAD_DATASET = "bad_dataset"

#: Per-window statistics each lag contributes, in this order, when the store has them.
FEATURE_STATS = ("mean", "stddev", "min", "max", "count", "p50", "p95")
#: What one time series is per, within one metric and window kind (svc_transform's
#: DIMENSIONS without the metric).
SERIES_COLUMNS = ("entity_id", "path", "unit")
#: svc_transform's Parquet partitions: ``date=/metric=/window=/batch=``.
PARTITIONS = (("date", "string"), ("metric", "string"), ("window", "string"), ("batch", "int64"))

#: The standard MNIST file names (each may also be gzipped, ``.gz``).
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

DIGITS_VAL_FRACTION = 0.2
DIGITS_TEST_FRACTION = 0.2
MNIST_VAL_FRACTION = 1 / 6
DEFAULT_LAGS = 3
# Chronological cut points of ``features``, in percent of the examples.
TRAIN_PERCENT, VAL_END_PERCENT = 70, 85
MIN_FEATURE_EXAMPLES = 10

_VERSION_CHARS = 16


def load(
    dataset: str, options: Mapping[str, str], *, seed: int = 0, features_path: str = ""
) -> DataSplits:
    """``dataset`` in fixed splits (see the module docstring).

    ``features_path`` is the offline store to use when ``options`` names no
    ``path`` (the trainer passes svc_transform's offline path). Raises
    TrialError: reason "unknown_dataset" for a name not in DATASETS,
    "bad_dataset" for missing or malformed data or bad options.
    """
    if dataset == "digits":
        return _digits(seed)
    if dataset == "mnist":
        return _mnist(options, seed)
    if dataset == "features":
        return _features(options, features_path)
    raise TrialError(
        f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}", reason="unknown_dataset"
    )


#: The options each dataset reads (the others do not change what it loads).
DATA_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "digits": (),
    "mnist": ("path", "limit", "val_fraction"),
    "features": ("path", "metric", "window", "lags"),
}


def cache_key(
    dataset: str, options: Mapping[str, str], *, seed: int = 0, features_path: str = ""
) -> tuple[str, ...]:
    """What ``load`` would return, named cheaply (no data is read): the
    dataset, the options it reads, the seed and a fingerprint of its files
    (names, sizes, modification times) or package. Equal keys, equal data,
    so an executor may keep loaded datasets by this key."""
    read = DATA_OPTIONS.get(dataset, ())
    used = tuple(f"{name}={options[name]}" for name in read if name in options)
    if dataset == "digits":
        from importlib.metadata import version

        files = f"scikit-learn {version('scikit-learn')}"
    elif dataset == "mnist":
        files = _files_fingerprint(options.get("path", ""), "*")
    elif dataset == "features":
        files = _files_fingerprint(options.get("path") or features_path, "**/*.parquet")
    else:
        files = ""
    return (dataset, *used, f"seed={seed}", f"features_path={features_path}", files)


def _files_fingerprint(directory: str, pattern: str) -> str:
    root = Path(directory)
    if not directory or not root.is_dir():
        return "missing"
    digest = hashlib.sha256()
    for path in sorted(root.glob(pattern)):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.relative_to(root)}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:_VERSION_CHARS]


# -- digits -------------------------------------------------------------------------------


def _digits(seed: int) -> DataSplits:
    # Imported here: scikit-learn takes a second to import and only digits needs it.
    import sklearn
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float64) / 16.0).astype(np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    train, val, test = stratified_split(y, DIGITS_VAL_FRACTION, DIGITS_TEST_FRACTION, seed)
    splits = (x[train], y[train], x[val], y[val], x[test], y[test])
    return _classification("digits", splits, 10, source=f"sklearn digits {sklearn.__version__}")


# -- mnist --------------------------------------------------------------------------------


def _mnist(options: Mapping[str, str], seed: int) -> DataSplits:
    root = options.get("path", "")
    if not root:
        raise TrialError(
            'dataset "mnist" needs options["path"]: the directory holding '
            + ", ".join(MNIST_FILES.values()),
            reason=BAD_DATASET,
        )
    files = _mnist_files(Path(root))
    x_train, y_train = _images_and_labels(files["train_images"], files["train_labels"])
    x_test, y_test = _images_and_labels(files["test_images"], files["test_labels"])
    if x_test.shape[1:] != x_train.shape[1:]:
        raise TrialError(
            f"MNIST images in {root}: train is {x_train.shape[1:]} but t10k is {x_test.shape[1:]}",
            reason=BAD_DATASET,
        )
    limit = _int_option(options, "limit", default=0, minimum=1)
    if limit:
        x_train, y_train = x_train[:limit], y_train[:limit]
    val_fraction = _fraction_option(options, "val_fraction", MNIST_VAL_FRACTION)
    train, val, _ = stratified_split(y_train, val_fraction, 0.0, seed)
    # 10 digits, or more for IDX sets with more classes (EMNIST letters).
    n_classes = max(10, int(max(y_train.max(), y_test.max())) + 1)
    splits = (x_train[train], y_train[train], x_train[val], y_train[val], x_test, y_test)
    return _classification("mnist", splits, n_classes, source=str(root))


def _mnist_files(root: Path) -> dict[str, Path]:
    """Each standard file's path, plain preferred over ``.gz``; all missing ones named."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for role, name in MNIST_FILES.items():
        candidates = [root / name, root / f"{name}.gz"]
        present = [path for path in candidates if path.is_file()]
        if present:
            found[role] = present[0]
        else:
            missing.append(f"{name}[.gz]")
    if missing:
        raise TrialError(
            f"MNIST directory {root} is missing {', '.join(missing)}", reason=BAD_DATASET
        )
    return found


def _images_and_labels(
    images_path: Path, labels_path: Path
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """(N, H, W) uint8 images scaled to [0, 1] and their N non-negative labels."""
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise TrialError(
            f"IDX file {images_path} holds {images.dtype} {images.shape}; "
            "expected uint8 images (N, H, W)",
            reason=BAD_DATASET,
        )
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise TrialError(
            f"IDX file {labels_path} holds {labels.dtype} {labels.shape}; "
            "expected integer labels (N,)",
            reason=BAD_DATASET,
        )
    if len(labels) != len(images) or not len(labels):
        raise TrialError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels",
            reason=BAD_DATASET,
        )
    if labels.min() < 0:
        raise TrialError(f"IDX file {labels_path} holds negative labels", reason=BAD_DATASET)
    return (images / np.float32(255.0)).astype(np.float32), labels.astype(np.int64)


# -- classification splits ----------------------------------------------------------------


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


def _classification(
    name: str,
    splits: tuple[
        NDArray[np.float32],
        NDArray[np.int64],
        NDArray[np.float32],
        NDArray[np.int64],
        NDArray[np.float32],
        NDArray[np.int64],
    ],
    n_classes: int,
    *,
    source: str,
) -> DataSplits:
    """Splits ordered (x_train, y_train, x_val, y_val, x_test, y_test); the
    version is a hash of exactly these arrays."""
    return DataSplits(
        name=name,
        version=_digest_arrays(*splits),
        task=TASK_CLASSIFICATION,
        x_train=splits[0],
        y_train=splits[1],
        x_val=splits[2],
        y_val=splits[3],
        x_test=splits[4],
        y_test=splits[5],
        n_classes=n_classes,
        source=source,
    )


def _digest_arrays(*arrays: NDArray[Any]) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:_VERSION_CHARS]


# -- features -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Windows:
    """One metric's windows of one kind, one row per (series, start), sorted by both."""

    series: NDArray[np.int64]
    start_us: NDArray[np.int64]
    slide_us: NDArray[np.int64]
    stats: NDArray[np.float64]  # (rows, len(stat_names)); NaN and null already 0
    mean: NDArray[np.float64]  # the target; NaN where the store has none
    stat_names: tuple[str, ...]


def feature_names(stat_names: Sequence[str], lags: int) -> list[str]:
    """The columns of ``features`` x: oldest lag first, then each lag's statistics.

    ``mean_lag3, stddev_lag3, …, p95_lag3, mean_lag2, …, p95_lag1`` for 3 lags
    and every statistic present.
    """
    return [f"{stat}_lag{lag}" for lag in range(lags, 0, -1) for stat in stat_names]


def _features(options: Mapping[str, str], features_path: str) -> DataSplits:
    root_text = options.get("path") or features_path
    if not root_text:
        raise TrialError(
            'dataset "features" needs options["path"] or the offline store path',
            reason=BAD_DATASET,
        )
    root = Path(root_text)
    if not root.is_dir():
        raise TrialError(f"offline feature store {root} does not exist", reason=BAD_DATASET)
    store = _open_store(root)
    metric, window = _choose_partition(store, options, root)
    lags = _int_option(options, "lags", default=DEFAULT_LAGS, minimum=1)
    selected = _partition_filter(metric, window)
    windows = _latest_windows(store, selected, f"{root} ({metric} @ {window})")
    x, y, target_start = _lagged_examples(windows, lags)
    if len(y) < MIN_FEATURE_EXAMPLES:
        raise TrialError(
            f"{root} gives {len(y)} examples of {metric} @ {window} with {lags} lags "
            f"(consecutive windows per entity); at least {MIN_FEATURE_EXAMPLES} are needed",
            reason=BAD_DATASET,
        )
    train, val, test = chronological_split(target_start)
    files = sorted(str(fragment.path) for fragment in store.get_fragments(filter=selected))
    return DataSplits(
        name="features",
        version=_digest_files(root, files, f"{metric}|{window}|{lags}"),
        task=TASK_REGRESSION,
        x_train=x[train],
        y_train=y[train],
        x_val=x[val],
        y_val=y[val],
        x_test=x[test],
        y_test=y[test],
        source=str(root),
        feature=f"{metric}@{window}" if lags == 1 else "",
    )


def _arrow() -> tuple[Any, Any]:
    """(pyarrow, pyarrow.dataset), imported on first use: only ``features`` needs them."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    return pa, ds


def _open_store(root: Path) -> Any:
    pa, ds = _arrow()
    partitioning = ds.partitioning(
        pa.schema([(name, pa.type_for_alias(kind)) for name, kind in PARTITIONS]), flavor="hive"
    )
    # Spark writes timestamps as INT96 by default; microseconds is their precision.
    parquet = ds.ParquetFileFormat(read_options={"coerce_int96_timestamp_unit": "us"})
    try:
        return ds.dataset(str(root), format=parquet, partitioning=partitioning)
    except (OSError, ValueError) as exc:
        raise TrialError(
            f"cannot read the Parquet store {root}: {exc}", reason=BAD_DATASET
        ) from exc


def _choose_partition(store: Any, options: Mapping[str, str], root: Path) -> tuple[str, str]:
    """(metric, window kind) from the options, or the only one the store holds."""
    _, ds = _arrow()
    present: set[tuple[str, str]] = set()
    for fragment in store.get_fragments():
        keys = ds.get_partition_keys(fragment.partition_expression)
        if keys.get("metric") is not None and keys.get("window") is not None:
            present.add((str(keys["metric"]), str(keys["window"])))
    if not present:
        raise TrialError(
            f"{root} holds no Parquet files under date=/metric=/window=/batch= partitions",
            reason=BAD_DATASET,
        )
    metric = _pick("metric", options.get("metric", ""), {m for m, _ in present}, root)
    windows = {w for m, w in present if m == metric}
    window = _pick(f"window (of {metric})", options.get("window", ""), windows, root)
    return metric, window


def _pick(what: str, wanted: str, available: set[str], root: Path) -> str:
    known = ", ".join(sorted(available))
    if wanted:
        if wanted not in available:
            raise TrialError(
                f"{root} has no {what} {wanted!r}; it has: {known}", reason=BAD_DATASET
            )
        return wanted
    if len(available) > 1:
        option = what.split()[0]
        raise TrialError(
            f'{root} holds several: set options["{option}"] to one of: {known}', reason=BAD_DATASET
        )
    return next(iter(available))


def _partition_filter(metric: str, window: str) -> Any:
    _, ds = _arrow()
    return (ds.field("metric") == metric) & (ds.field("window") == window)


def _latest_windows(store: Any, selected: Any, where: str) -> _Windows:
    """The selected windows; of a window a replayed batch wrote again, the latest batch's."""
    names = set(store.schema.names)
    for required in ("window_start", "window_slide", "mean"):
        if required not in names:
            raise TrialError(f"{where}: no {required!r} column", reason=BAD_DATASET)
    stat_names = tuple(stat for stat in FEATURE_STATS if stat in names)
    series_columns = [c for c in SERIES_COLUMNS if c in names]
    columns = [*series_columns, "window_start", "window_slide", "batch", *stat_names]
    table = store.to_table(columns=columns, filter=selected)
    series = _series_codes(table, series_columns)
    start = _micros(table["window_start"])
    batch = _int64(table["batch"])
    order = np.lexsort((batch, start, series))
    series, start, batch = series[order], start[order], batch[order]
    # Sorted by batch within a window: the last row of each window is the latest batch's.
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (series[1:] != series[:-1]) | (start[1:] != start[:-1])
    kept = order[last]
    stats = np.column_stack([_float64(table[stat]) for stat in stat_names])[kept]
    return _Windows(
        series=series[last],
        start_us=start[last],
        slide_us=_int64(table["window_slide"])[kept] * 1_000_000,
        stats=np.where(np.isfinite(stats), stats, 0.0),
        mean=_float64(table["mean"])[kept],
        stat_names=stat_names,
    )


def _lagged_examples(
    windows: _Windows, lags: int
) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.int64]]:
    """(x, y, target window start µs), one example per window whose ``lags``
    predecessors in its series are all present and consecutive (each starts
    one slide after the one before): x their statistics in ``feature_names``
    order, y the window's mean. Windows with no finite mean are no target."""
    n, width = len(windows.start_us), lags * len(windows.stat_names)
    if n <= lags:
        empty = np.empty((0, width), dtype=np.float32)
        return empty, np.empty(0, dtype=np.float32), np.empty(0, dtype=np.int64)
    # follows[j]: window j + 1 comes right after window j in the same series.
    follows = (windows.series[1:] == windows.series[:-1]) & (
        windows.start_us[1:] - windows.start_us[:-1] == windows.slide_us[1:]
    )
    targets = np.arange(lags, n)
    usable = sliding_window_view(follows, lags).all(axis=1)
    usable &= np.isfinite(windows.mean[targets])
    history = sliding_window_view(windows.stats, (lags, len(windows.stat_names)))[:, 0]
    x = history[: n - lags][usable].reshape(-1, width)
    chosen = targets[usable]
    return (
        x.astype(np.float32),
        windows.mean[chosen].astype(np.float32),
        windows.start_us[chosen],
    )


def chronological_split(
    target_start: NDArray[np.int64],
) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp]]:
    """Example indices (train, validation, test) by target window start: the
    first 70 % train, the next 15 % validation, the rest test.

    Every validation target starts after every training one and before every
    test one: a cut that would fall among examples of one start moves before
    them. Raises TrialError when a split would be empty.
    """
    order = np.argsort(target_start, kind="stable")
    times = target_start[order]
    n = len(times)
    cuts = [
        _cut_before_ties(times, n * percent // 100) for percent in (TRAIN_PERCENT, VAL_END_PERCENT)
    ]
    bounds = [0, *cuts, n]
    parts = tuple(order[lo:hi] for lo, hi in itertools.pairwise(bounds))
    if any(not len(part) for part in parts):
        raise TrialError(
            f"{n} examples over {len(np.unique(times))} distinct target windows cannot be "
            "split 70/15/15 in time with every split non-empty",
            reason=BAD_DATASET,
        )
    return parts[0], parts[1], parts[2]


def _cut_before_ties(times: NDArray[np.int64], cut: int) -> int:
    if cut >= len(times):
        return len(times)
    return int(np.searchsorted(times, times[cut], side="left"))


def _series_codes(table: Any, columns: Sequence[str]) -> NDArray[np.int64]:
    """One integer per distinct (entity, path, unit), ordered as the values sort."""
    if not columns:
        return np.zeros(table.num_rows, dtype=np.int64)
    codes = []
    for column in columns:
        values = table[column].fill_null("").to_numpy(zero_copy_only=False).astype(str)
        codes.append(np.unique(values, return_inverse=True)[1].reshape(-1))
    combined = np.unique(np.column_stack(codes), axis=0, return_inverse=True)[1]
    return np.asarray(combined, dtype=np.int64).reshape(-1)


def _micros(column: Any) -> NDArray[np.int64]:
    pa, _ = _arrow()
    unit_us = pa.timestamp("us", tz=column.type.tz)
    return _int64(column.cast(unit_us).cast(pa.int64()))


def _int64(column: Any) -> NDArray[np.int64]:
    return np.asarray(column.fill_null(0).to_numpy(), dtype=np.int64)


def _float64(column: Any) -> NDArray[np.float64]:
    pa, _ = _arrow()
    # Nulls become NaN, which the caller treats as missing.
    return np.asarray(column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def _digest_files(root: Path, files: Sequence[str], selection: str) -> str:
    """Changes when a selected file is added, removed, resized or rewritten, or
    the selection (metric, window, lags) changes."""
    digest = hashlib.sha256(selection.encode())
    for name in files:
        stat = Path(name).stat()
        relative = Path(name).relative_to(root) if Path(name).is_relative_to(root) else name
        digest.update(f"\n{relative}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:_VERSION_CHARS]


# -- options ------------------------------------------------------------------------------


def _int_option(options: Mapping[str, str], name: str, *, default: int, minimum: int) -> int:
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


def _fraction_option(options: Mapping[str, str], name: str, default: float) -> float:
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
