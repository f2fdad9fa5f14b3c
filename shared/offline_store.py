"""The offline feature store read back: svc_transform's Parquet windows
(``shared.feature_store`` names the layout), one metric's windows of one kind
at a time, the latest batch of each window winning (a replayed batch writes
a window again).

The one reader of the store's windows: svc_trainer's ``features`` dataset
trains on them, a model registered from outside takes its training
distribution from them (``aistack.models``), and the lineage walk follows a
model's training files back to the clean events under their windows
(``stored_windows``). Problems with the store raise
``OfflineStoreError`` (reason ``bad_dataset``) with one line naming them.

The store is a local directory or, named by a URL (``s3://bucket/prefix``,
``s3a://`` as Spark writes it), on the object store that
``ObjectStoreSettings`` describes (``shared.object_store``); its files are
then named by URL too (``store_files``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from shared import distribution, object_store
from shared.contracts.aistack.v1 import models_pb2
from shared.errors import InvalidArgument
from shared.feature_store import (
    FEATURE_STATS,
    PARTITION_COLUMNS,
    PARTITIONS,
    SERIES_COLUMNS,
    Series,
    merge_source_column,
    online_field,
)
from shared.settings import ObjectStoreSettings

#: A store's root: a local directory, or a URL (``s3://bucket/prefix``).
Root = Path | str


class OfflineStoreError(InvalidArgument):
    """The store, or what was asked of it, cannot be read."""

    reason = "bad_dataset"


@dataclass(frozen=True)
class Windows:
    """One metric's windows of one kind, one row per (series, start), sorted by both."""

    series: NDArray[np.int64]
    start_us: NDArray[np.int64]
    slide_us: NDArray[np.int64]
    stats: NDArray[np.float64]  # (rows, len(stat_names)); NaN and null already 0
    target: NDArray[np.float64]  # the label statistic; NaN where the store has none
    stat_names: tuple[str, ...]


def _arrow() -> tuple[Any, Any]:
    """(pyarrow, pyarrow.dataset), imported on first use: only readers need them."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    return pa, ds


def is_url(root: Root) -> bool:
    """Whether ``root`` names the store by URL (``s3://…``), not a local path."""
    return isinstance(root, str) and bool(object_store.scheme(root))


def open_store(root: Root, settings: ObjectStoreSettings | None = None) -> Any:
    """The store under ``root`` as a pyarrow dataset with its partitions; a
    URL's through ``settings`` (default: the environment's)."""
    try:
        if not is_url(root):
            return _dataset(str(root))
        filesystem, path = object_store.filesystem(str(root), settings)
        return _dataset(path, object_store.arrow_filesystem(filesystem))
    except (OSError, ValueError) as exc:
        raise OfflineStoreError(f"cannot read the Parquet store {root}: {exc}") from exc


def store_files(store: Any, root: Root, selected: Any = None) -> list[str]:
    """The store's files (those of the ``selected`` partitions), sorted: local
    paths, or URLs with ``root``'s scheme for a store named by URL."""
    paths = sorted(str(fragment.path) for fragment in store.get_fragments(filter=selected))
    if not is_url(root):
        return paths
    scheme = object_store.scheme(str(root))
    return [f"{scheme}://{path}" for path in paths]


def open_store_files(files: Sequence[str], settings: ObjectStoreSettings | None = None) -> Any:
    """Some of the store's files (paths under its partition directories) as
    a pyarrow dataset with their partitions; files named by URL (all of one
    scheme) through ``settings`` (default: the environment's), the
    fragments' paths then without the scheme (``bucket/key``)."""
    try:
        if not files or not is_url(files[0]):
            return _dataset(list(files))
        filesystem, _ = object_store.filesystem(files[0], settings)
        paths = [_path_of(filesystem, name) for name in files]
        return _dataset(paths, object_store.arrow_filesystem(filesystem))
    except (OSError, ValueError) as exc:
        raise OfflineStoreError(f"cannot read the store's files: {exc}") from exc


def _path_of(filesystem: Any, url: str) -> str:
    """``url``'s path on its fsspec ``filesystem``."""
    return str(filesystem._strip_protocol(url)).rstrip("/")


def _dataset(source: str | list[str], filesystem: Any = None) -> Any:
    pa, ds = _arrow()
    partitioning = ds.partitioning(
        pa.schema([(name, pa.type_for_alias(kind)) for name, kind in PARTITIONS]), flavor="hive"
    )
    # Spark writes timestamps as INT96 by default; microseconds is their precision.
    parquet = ds.ParquetFileFormat(read_options={"coerce_int96_timestamp_unit": "us"})
    # Files under "_" and "." are the writers' own (_SUCCESS, S3A's
    # __magic_job-… of a commit in progress, .crc): pyarrow's default skips them.
    return ds.dataset(source, format=parquet, partitioning=partitioning, filesystem=filesystem)


def choose(
    store: Any, metric: str, window: str, root: Root, *, named_in: str = ""
) -> tuple[str, str]:
    """(metric, window kind): the ones given ("" for any), which the store
    must hold, or the only one it holds. ``named_in``: where the caller's
    user names them (``options``), for the message when the store holds
    several."""
    _, ds = _arrow()
    present: set[tuple[str, str]] = set()
    for fragment in store.get_fragments():
        keys = ds.get_partition_keys(fragment.partition_expression)
        if keys.get("metric") is not None and keys.get("window") is not None:
            present.add((str(keys["metric"]), str(keys["window"])))
    if not present:
        raise OfflineStoreError(
            f"{root} holds no Parquet files under {_LAYOUT} partitions",
        )
    metric = _pick("metric", metric, {m for m, _ in present}, root, named_in)
    windows = {w for m, w in present if m == metric}
    window = _pick(f"window (of {metric})", window, windows, root, named_in)
    return metric, window


_LAYOUT = "/".join(f"{name}=" for name in PARTITION_COLUMNS)


def _pick(what: str, wanted: str, available: set[str], root: Root, named_in: str) -> str:
    known = ", ".join(sorted(available))
    if wanted:
        if wanted not in available:
            raise OfflineStoreError(f"{root} has no {what} {wanted!r}; it has: {known}")
        return wanted
    if len(available) > 1:
        option = what.split()[0]
        name = f'set {named_in}["{option}"] to' if named_in else f"name the {option},"
        raise OfflineStoreError(f"{root} holds several: {name} one of: {known}")
    return next(iter(available))


def selection(metric: str, window: str) -> Any:
    _, ds = _arrow()
    return (ds.field("metric") == metric) & (ds.field("window") == window)


def latest_windows(
    store: Any,
    selected: Any,
    where: str,
    bounds: tuple[int | None, int | None],
    label: str = "mean",
) -> Windows:
    """The selected windows starting within ``bounds`` (µs, inclusive; None:
    open); of a window a replayed batch wrote again, the latest batch's."""
    names = set(store.schema.names)
    for required in ("window_start", "window_slide", "mean", label):
        if required not in names:
            raise OfflineStoreError(f"{where}: no {required!r} column")
    stat_names = tuple(stat for stat in FEATURE_STATS if stat in names)
    series_columns = [c for c in SERIES_COLUMNS if c in names]
    columns = [*series_columns, "window_start", "window_slide", "batch", *stat_names]
    table = store.to_table(columns=columns, filter=selected)
    low, high = bounds
    if low is not None or high is not None:
        start = _micros(table["window_start"])
        inside = np.ones(len(start), dtype=bool)
        if low is not None:
            inside &= start >= low
        if high is not None:
            inside &= start <= high
        pa, _ = _arrow()
        table = table.filter(pa.array(inside))
    series = _series_codes(table, series_columns)
    start = _micros(table["window_start"])
    kept = _latest(series, start, _int64(table["batch"]))
    stats = np.column_stack([_float64(table[stat]) for stat in stat_names])[kept]
    return Windows(
        series=series[kept],
        start_us=start[kept],
        slide_us=_int64(table["window_slide"])[kept] * 1_000_000,
        stats=np.where(np.isfinite(stats), stats, 0.0),
        target=_float64(table[label])[kept],
        stat_names=stat_names,
    )


def _latest(
    series: NDArray[np.int64], start: NDArray[np.int64], batch: NDArray[np.int64]
) -> NDArray[np.int64]:
    """The rows to read, sorted by series and start: of a window (a series'
    start) stored by several batches, the latest batch's row."""
    order = np.lexsort((batch, start, series))
    series, start = series[order], start[order]
    # Sorted by batch within a window: the last row of each window is the latest batch's.
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (series[1:] != series[:-1]) | (start[1:] != start[:-1])
    return np.asarray(order[last], dtype=np.int64)


@dataclass(frozen=True)
class StoredWindows:
    """Windows read from offline-store files, one row each: its series
    (``shared.feature_store.Series``), start and end (µs); and the clean
    events under all of them, merged per partition
    (``shared.feature_store.merge_sources``)."""

    series: list[Series]
    start_us: list[int]
    end_us: list[int]
    sources: list[dict[str, Any]]


def stored_windows(
    files: Sequence[str], settings: ObjectStoreSettings | None = None
) -> StoredWindows:
    """The windows in the offline store's ``files`` (their metric and kind
    read from each file's partitions), the latest batch's row of a window
    stored twice, as the trainer reads them. Files written before windows
    carried their ``sources`` hold none to follow: left out. ``files`` may
    be URLs (all of one scheme, on the store ``settings`` describes, as
    ``open_store_files``)."""
    if not files:
        return StoredWindows([], [], [], [])
    store = open_store_files(files, settings)
    with_sources = [
        fragment.path
        for fragment in store.get_fragments()
        if "sources" in fragment.physical_schema.names
    ]
    if not with_sources:
        return StoredWindows([], [], [], [])
    if len(with_sources) < len(files):
        _, ds = _arrow()
        store = ds.dataset(
            with_sources,
            format=store.format,
            partitioning=store.partitioning,
            filesystem=store.filesystem,
        )
    names = set(store.schema.names)
    series_columns = [c for c in SERIES_COLUMNS if c in names]
    columns = ["metric", "window", *series_columns, "window_start", "window_end", "batch"]
    table = store.to_table(columns=[*columns, "sources"])
    start = _micros(table["window_start"])
    kept = _latest(
        _series_codes(table, ["metric", "window", *series_columns]), start, _int64(table["batch"])
    )
    pa, _ = _arrow()
    table = table.take(pa.array(kept))
    paths = table["path"] if "path" in names else pa.nulls(table.num_rows, pa.string())
    series = zip(
        table["entity_id"].to_pylist(),
        table["metric"].to_pylist(),
        paths.fill_null("").to_pylist(),
        strict=True,
    )
    return StoredWindows(
        series=[(entity, metric, path) for entity, metric, path in series],
        start_us=start[kept].tolist(),
        end_us=_micros(table["window_end"]).tolist(),
        sources=merge_source_column(table["sources"]),
    )


def superseded(
    files: Sequence[str], settings: ObjectStoreSettings | None = None
) -> dict[str, list[int]]:
    """Per file among ``files`` (the offline store's, or any Parquet), the
    rows a later batch wrote again, by index in the file: what a reader of
    every row skips to read each window once, as ``latest_windows`` does.
    Empty for files without the store's ``batch`` partition and
    ``window_start``, and whenever no two batches of a metric and window kind
    hold windows starting in overlapping spans (the usual store: each batch
    closes later windows), which each file's window starts alone show.
    ``files`` may be URLs (all of one scheme, on the store ``settings``
    describes, as ``open_store_files``): the answer names them as given."""

    pa, ds = _arrow()
    try:
        store = open_store_files(files, settings)
    except OfflineStoreError:
        return {}
    named: dict[str, str] = {}
    if files and is_url(files[0]):
        filesystem, _ = object_store.filesystem(files[0], settings)
        named = {_path_of(filesystem, name): name for name in files}
    spans: dict[tuple[Any, Any], list[tuple[int, int, int, str]]] = {}
    fragments = {}
    for fragment in store.get_fragments():
        fragments[fragment.path] = fragment
        keys = ds.get_partition_keys(fragment.partition_expression)
        if keys.get("batch") is None or "window_start" not in fragment.physical_schema.names:
            continue
        starts = _micros(fragment.to_table(columns=["window_start"])["window_start"])
        if len(starts):
            group = (keys.get("metric"), keys.get("window"))
            low, high = int(starts.min()), int(starts.max())
            spans.setdefault(group, []).append((low, high, int(keys["batch"]), fragment.path))
    overlapping = sorted({path for group in spans.values() for path in _overlapping(group)})
    if not overlapping:
        return {}
    present = set(store.schema.names)
    columns = [c for c in ("metric", "window", *SERIES_COLUMNS) if c in present]
    # File by file, each in its own row order: a row's file and index in it.
    tables = [
        fragments[path].to_table(schema=store.schema, columns=[*columns, "window_start", "batch"])
        for path in overlapping
    ]
    table = pa.concat_tables(tables)
    names = [path for path, part in zip(overlapping, tables, strict=True) for _ in range(len(part))]
    row = np.concatenate([np.arange(len(part), dtype=np.int64) for part in tables])
    kept = np.zeros(table.num_rows, dtype=bool)
    kept[
        _latest(
            _series_codes(table, columns), _micros(table["window_start"]), _int64(table["batch"])
        )
    ] = True
    dropped: dict[str, list[int]] = {}
    for i in np.flatnonzero(~kept):
        dropped.setdefault(named.get(names[i], names[i]), []).append(int(row[i]))
    return dropped


def latest_batch_rows(frame: Any) -> Any:
    """Spark's side of ``superseded``: ``frame`` (the store as Spark reads
    it) with only the latest batch's row of each window. A shuffle: for a
    store where ``superseded`` found rows to skip."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if "batch" not in frame.columns or "window_start" not in frame.columns:
        return frame
    keys = [c for c in ("metric", "window", *SERIES_COLUMNS, "window_start") if c in frame.columns]
    latest = Window.partitionBy(*keys).orderBy(F.col("batch").desc())
    rank = "_aistack_latest"
    return frame.withColumn(rank, F.row_number().over(latest)).where(F.col(rank) == 1).drop(rank)


def _overlapping(spans: list[tuple[int, int, int, str]]) -> set[str]:
    """The files whose span of window starts overlaps another batch's."""
    found: set[str] = set()
    for i, (low, high, batch, path) in enumerate(spans):
        for other_low, other_high, other_batch, other in spans[i + 1 :]:
            if batch != other_batch and low <= other_high and other_low <= high:
                found.update((path, other))
    return found


def latest_start_us(store: Any, selected: Any) -> int | None:
    column = store.to_table(columns=["window_start"], filter=selected)["window_start"]
    if not len(column):
        return None
    return int(_micros(column).max())


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


def training_distribution(
    root: Root,
    feature: str,
    bounds: tuple[int | None, int | None] = (None, None),
    settings: ObjectStoreSettings | None = None,
) -> models_pb2.TrainingDistribution:
    """The distribution of ``feature``'s windows in the store at ``root`` (a
    URL's through ``settings``, as ``open_store``) (a field ``metric@window``,
    e.g. ``temperature@tumbling-60s``), those starting within ``bounds`` (µs,
    inclusive; None: open): the reference a model that read them is watched
    against. OfflineStoreError for another field, or no such windows."""
    metric, _, window = feature.rpartition("@")
    if not metric or not window or "|" in metric:
        raise OfflineStoreError(
            f"feature {feature!r}: expected metric@window, e.g. temperature@tumbling-60s"
        )
    store = open_store(root, settings)
    choose(store, metric, window, root)
    windows = latest_windows(store, selection(metric, window), f"{root} ({feature})", bounds)
    if not len(windows.start_us):
        raise OfflineStoreError(f"{root} holds no windows of {feature} within the bounds given")
    return distribution.training_distribution(
        feature=online_field(metric, window),
        metric=metric,
        window=window,
        statistics={name: windows.stats[:, i] for i, name in enumerate(windows.stat_names)},
        first_window_start_us=int(windows.start_us.min()),
        last_window_start_us=int(windows.start_us.max()),
    )
