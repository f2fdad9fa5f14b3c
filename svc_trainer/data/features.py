"""The ``features`` dataset: next-window forecasting on svc_transform's
Parquet offline store (``shared.feature_store`` names its layout).

An example is one window of a series (entity, path, unit) of the chosen
metric and window kind: x the ``FEATURE_STATS`` of the ``lags`` windows
before it, oldest first, y its ``label`` statistic (``options["label"]``,
one of ``FEATURE_STATS``: the mean by default, or its max, p95, count...).
The split is chronological, so the seed changes nothing. ``window_from`` /
``window_to`` (RFC 3339, inclusive) keep only the windows starting between
them, lags and targets alike: a re-tune trains on the drifted data alone.

With the splits comes the training distribution (``shared.distribution``):
per statistic, the quantiles of the lag-1 windows of the training examples
(the window right before each target, what a served one-lag model reads),
which the drift monitor compares live windows with.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from shared import object_store, offline_store
from shared.contracts.aistack.v1 import models_pb2
from shared.distribution import training_distribution
from shared.feature_store import (
    FEATURE_STATS,
    WINDOW_FROM,
    WINDOW_TO,
    forecast_label,
    online_field,
)
from shared.offline_store import Windows
from svc_trainer.data.options import BAD_DATASET, VERSION_CHARS, int_option
from svc_trainer.plan import TASK_REGRESSION, DataSplits, TrialError

DEFAULT_LAGS = 3
# Chronological cut points, in percent of the examples.
TRAIN_PERCENT, VAL_END_PERCENT = 70, 85
MIN_FEATURE_EXAMPLES = 10
# Svc_transform writes a micro-batch's Parquet within seconds of its Kafka
# records; a minute is a store that has stopped, not one behind.
STORE_CATCH_UP_SECONDS = 60.0
STORE_POLL_SECONDS = 1.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def feature_names(stat_names: Sequence[str], lags: int) -> list[str]:
    """The columns of ``features`` x: oldest lag first, then each lag's statistics.

    ``mean_lag3, stddev_lag3, …, p95_lag3, mean_lag2, …, p95_lag1`` for 3 lags
    and every statistic present.
    """
    return [f"{stat}_lag{lag}" for lag in range(lags, 0, -1) for stat in stat_names]


def load_features(
    options: Mapping[str, str],
    features_path: str,
    *,
    catch_up_seconds: float = STORE_CATCH_UP_SECONDS,
) -> DataSplits:
    """The dataset from the store at ``options["path"]``, else ``features_path``.

    With ``window_to``, the read waits (up to ``catch_up_seconds``) until the
    store holds a window of the metric starting at or after it: svc_transform
    writes Parquet beside Kafka, not before, so a trial asked for windows just
    seen on the bus (a re-tune) can arrive before their files.

    Raises TrialError(reason="bad_dataset") for a missing or unreadable store,
    an ambiguous or unknown metric or window, bad options, a store that does
    not reach ``window_to`` in time, or too few examples."""
    try:
        return _load(options, features_path, catch_up_seconds)
    except offline_store.OfflineStoreError as exc:
        raise TrialError(str(exc), reason=BAD_DATASET) from exc


def _load(options: Mapping[str, str], features_path: str, catch_up_seconds: float) -> DataSplits:
    root_text = options.get("path") or features_path
    if not root_text:
        raise TrialError(
            'dataset "features" needs options["path"] or the offline store path',
            reason=BAD_DATASET,
        )
    # A URL (s3://bucket/prefix) names a store on the object store.
    root: offline_store.Root = root_text if offline_store.is_url(root_text) else Path(root_text)
    if isinstance(root, Path) and not root.is_dir():
        raise TrialError(f"offline feature store {root} does not exist", reason=BAD_DATASET)
    store = offline_store.open_store(root)
    metric, window = offline_store.choose(
        store, options.get("metric", ""), options.get("window", ""), root, named_in="options"
    )
    lags = int_option(options, "lags", default=DEFAULT_LAGS, minimum=1)
    bounds = window_bounds(options)
    selected = offline_store.selection(metric, window)
    if bounds[1] is not None:
        store = _caught_up(root, store, selected, bounds[1], catch_up_seconds)
    label = options.get("label") or "mean"
    if label not in FEATURE_STATS:
        raise TrialError(
            f'options["label"]={label!r}: expected a window statistic, one of '
            f"{', '.join(FEATURE_STATS)}",
            reason=BAD_DATASET,
        )
    where = f"{root} ({metric} @ {window})"
    windows = offline_store.latest_windows(store, selected, where, bounds, label)
    x, y, targets = _lagged_examples(windows, lags)
    if len(y) < MIN_FEATURE_EXAMPLES:
        raise TrialError(
            f"{root} gives {len(y)} examples of {metric} @ {window} with {lags} lags "
            f"(consecutive windows per entity{_bounds_text(options)}); "
            f"at least {MIN_FEATURE_EXAMPLES} are needed",
            reason=BAD_DATASET,
        )
    train, val, test = chronological_split(windows.start_us[targets])
    files = offline_store.store_files(store, root, selected)
    selection = f"{metric}|{window}|{lags}"
    if label != "mean":
        # The default keeps the versions it had before labels existed.
        selection += f"|label={label}"
    if bounds != (None, None):
        # Unbounded reads keep the versions they had before bounds existed.
        selection += f"|{bounds[0]}|{bounds[1]}"

    def distribution(rows: NDArray[np.intp]) -> str:
        message = _training_distribution(windows, targets[rows] - 1, metric, window)
        return json_format.MessageToJson(message, indent=None)

    return DataSplits(
        name="features",
        version=_digest_files(root, files, selection),
        task=TASK_REGRESSION,
        x_train=x[train],
        y_train=y[train],
        x_val=x[val],
        y_val=y[val],
        x_test=x[test],
        y_test=y[test],
        source=str(root),
        files=tuple(files),
        # Trained on every path's series: by default it reads the path-less field.
        feature=online_field(metric, window) if lags == 1 else "",
        distribution=distribution(train),
        train_val_distribution=distribution(np.concatenate([train, val])),
        feature_names=tuple(feature_names(windows.stat_names, lags)),
        label=forecast_label(label, metric),
        split=f"chronological {TRAIN_PERCENT}/{VAL_END_PERCENT - TRAIN_PERCENT}/"
        f"{100 - VAL_END_PERCENT}",
    )


def window_bounds(options: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(``window_from``, ``window_to``) in µs since the epoch, None where
    absent or empty. Raises TrialError(reason="bad_dataset") naming the option
    for a value that is not an RFC 3339 timestamp with a zone, or bounds in
    the wrong order."""
    low, high = (_timestamp_option(options, name) for name in (WINDOW_FROM, WINDOW_TO))
    if low is not None and high is not None and low > high:
        raise TrialError(
            f'options["{WINDOW_FROM}"]={options[WINDOW_FROM]!r} is after '
            f'options["{WINDOW_TO}"]={options[WINDOW_TO]!r}',
            reason=BAD_DATASET,
        )
    return low, high


def _timestamp_option(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name, "").strip()
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise TrialError(
            f'options["{name}"]={text!r}: expected an RFC 3339 timestamp '
            'such as "2026-11-24T10:00:00Z"',
            reason=BAD_DATASET,
        ) from exc
    if moment.tzinfo is None:
        raise TrialError(
            f'options["{name}"]={text!r} has no time zone: add "Z" for UTC', reason=BAD_DATASET
        )
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _bounds_text(options: Mapping[str, str]) -> str:
    named = [f"{name} {options[name]}" for name in (WINDOW_FROM, WINDOW_TO) if options.get(name)]
    return "".join(f", {text}" for text in named)


def _training_distribution(
    windows: Windows, rows: NDArray[np.intp], metric: str, window: str
) -> models_pb2.TrainingDistribution:
    """The ``TrainingDistribution`` of the windows at ``rows`` (non-empty)."""
    return training_distribution(
        feature=online_field(metric, window),
        metric=metric,
        window=window,
        statistics={
            stat: windows.stats[rows, column] for column, stat in enumerate(windows.stat_names)
        },
        first_window_start_us=int(windows.start_us[rows].min()),
        last_window_start_us=int(windows.start_us[rows].max()),
    )


def _caught_up(
    root: offline_store.Root, store: Any, selected: Any, until_us: int, seconds: float
) -> Any:
    """The store, read again until a selected window starts at or after
    ``until_us``; TrialError when none does within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        latest = offline_store.latest_start_us(store, selected)
        if latest is not None and latest >= until_us:
            return store
        if time.monotonic() >= deadline:
            held = "no windows" if latest is None else f"windows up to {_rfc3339(latest)}"
            raise TrialError(
                f"{root} holds {held}, not yet {WINDOW_TO} {_rfc3339(until_us)}, "
                f"after {seconds:g} s",
                reason=BAD_DATASET,
            )
        time.sleep(STORE_POLL_SECONDS)
        store = offline_store.open_store(root)


def _rfc3339(micros: int) -> str:
    return (_EPOCH + timedelta(microseconds=micros)).isoformat().replace("+00:00", "Z")


def _lagged_examples(
    windows: Windows, lags: int
) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.intp]]:
    """(x, y, target window rows), one example per window whose ``lags``
    predecessors in its series are all present and consecutive (each starts
    one slide after the one before): x their statistics in ``feature_names``
    order, y the window's label statistic. Windows without a finite one are
    no target.
    A target's lag-1 window is the row before it."""
    n, width = len(windows.start_us), lags * len(windows.stat_names)
    if n <= lags:
        empty = np.empty((0, width), dtype=np.float32)
        return empty, np.empty(0, dtype=np.float32), np.empty(0, dtype=np.intp)
    # follows[j]: window j + 1 comes right after window j in the same series.
    follows = (windows.series[1:] == windows.series[:-1]) & (
        windows.start_us[1:] - windows.start_us[:-1] == windows.slide_us[1:]
    )
    targets = np.arange(lags, n)
    usable = sliding_window_view(follows, lags).all(axis=1)
    usable &= np.isfinite(windows.target[targets])
    history = sliding_window_view(windows.stats, (lags, len(windows.stat_names)))[:, 0]
    x = history[: n - lags][usable].reshape(-1, width)
    chosen = targets[usable]
    return x.astype(np.float32), windows.target[chosen].astype(np.float32), chosen


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


def _digest_files(root: offline_store.Root, files: Sequence[str], selection: str) -> str:
    """Changes when a selected file is added, removed, resized or rewritten, or
    the selection (metric, window, lags, window bounds) changes."""
    digest = hashlib.sha256(selection.encode())
    if isinstance(root, str):
        stamps = _object_stamps(root)
        for name in files:
            key = name.removeprefix(root.rstrip("/") + "/")
            digest.update(f"\n{key}|{stamps.get(name, '')}".encode())
        return digest.hexdigest()[:VERSION_CHARS]
    for name in files:
        stat = Path(name).stat()
        relative = Path(name).relative_to(root) if Path(name).is_relative_to(root) else name
        digest.update(f"\n{relative}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:VERSION_CHARS]


def _object_stamps(root: str) -> dict[str, str]:
    """Each object's size and ETag under the store's URL ``root``, by URL,
    from one listing (not a request per file)."""
    fs, path = object_store.filesystem(root)
    scheme = object_store.scheme(root)
    return {
        f"{scheme}://{name}": f"{info.get('size')}|{info.get('ETag') or info.get('LastModified')}"
        for name, info in fs.find(path, detail=True).items()
    }
