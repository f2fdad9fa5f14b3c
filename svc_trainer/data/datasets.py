"""The trainer's datasets, in fixed, seeded train/validation/test splits.

``load(dataset, options, seed=..., features_path=...)`` knows four datasets
and the user's loaders:

* ``digits``: scikit-learn's 8x8 digits (shipped with scikit-learn, no download), split by
  ``shared.digits``, which the demo reads the same rows through.
* ``mnist``: the four standard IDX files in ``options["path"]``.
* ``features``: next-window forecasting on svc_transform's Parquet offline store
  (``svc_trainer.data.features``).
* ``table``: a user's Parquet or CSV table (``svc_trainer.data.tables``).
* ``package.module:function``: a loader of the user's
  (``svc_trainer.user_code.loaders``).
* ``""``: no data, for a training loop of the user's that reads its own.

Every split is a pure function of the files, the options and the seed: the
same inputs give byte-identical arrays, and the seed only changes which rows
go where (``features`` is chronological and ignores it). Problems with the data
or its options raise ``TrialError(reason="bad_dataset")``; the tuner does not
retry them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from shared import code_refs, digits
from svc_trainer.data import tables as table_data
from svc_trainer.data.features import load_features
from svc_trainer.data.idx import read_idx
from svc_trainer.data.options import (
    BAD_DATASET,
    VERSION_CHARS,
    digest_arrays,
    fraction_option,
    int_option,
    stratified_split,
)
from svc_trainer.plan import TASK_CLASSIFICATION, DataSplits, TrialError

DATASETS = ("digits", "mnist", "features", "table")

#: The standard MNIST file names (each may also be gzipped, ``.gz``).
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

MNIST_VAL_FRACTION = 1 / 6


def load(
    dataset: str, options: Mapping[str, str], *, seed: int = 0, features_path: str = ""
) -> DataSplits:
    """``dataset`` in fixed splits (see the module docstring).

    ``features_path`` is the offline store to use when ``options`` names no
    ``path`` (the trainer passes svc_transform's offline path). Raises
    TrialError: reason "unknown_dataset" for a name not in DATASETS,
    "bad_dataset" for missing or malformed data or bad options; a user's
    loader that cannot be imported or fails, as ``user_code.loaders`` says.
    """
    if dataset == "digits":
        return _digits(seed)
    if dataset == "mnist":
        return _mnist(options, seed)
    if dataset == "features":
        return load_features(options, features_path)
    if dataset == table_data.NAME:
        return table_data.load_table(options, seed)
    if code_refs.is_ref(dataset):
        from svc_trainer.user_code.loaders import load_with

        return load_with(dataset, options, seed)
    if not dataset:
        return NO_DATA
    raise TrialError(
        f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}, or a loader "
        "package.module:function",
        reason="unknown_dataset",
    )


#: What a training loop of the user's that reads its own data gets.
_NOTHING = np.empty((0,), dtype=np.float32)
NO_DATA = DataSplits(
    name="",
    version="",
    task="",
    x_train=_NOTHING,
    y_train=_NOTHING,
    x_val=_NOTHING,
    y_val=_NOTHING,
    x_test=_NOTHING,
    y_test=_NOTHING,
)

#: The options each dataset reads (the others do not change what it loads).
DATA_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "digits": (),
    "mnist": ("path", "limit", "val_fraction"),
    "features": ("path", "metric", "window", "lags", "window_from", "window_to", "label"),
    table_data.NAME: table_data.OPTIONS,
}


def cache_key(
    dataset: str, options: Mapping[str, str], *, seed: int = 0, features_path: str = ""
) -> tuple[str, ...]:
    """What ``load`` would return, named cheaply (no data is read): the
    dataset, the options it reads, the seed and a fingerprint of its files
    (names, sizes, modification times) or package. Equal keys, equal data,
    so an executor may keep loaded datasets by this key."""
    # A loader may read any option.
    read = DATA_OPTIONS.get(dataset, tuple(sorted(options)) if code_refs.is_ref(dataset) else ())
    used = tuple(f"{name}={options[name]}" for name in read if name in options)
    if dataset == "digits":
        from importlib.metadata import version

        files = f"scikit-learn {version('scikit-learn')}"
    elif dataset == "mnist":
        files = _files_fingerprint(options.get("path", ""), "*")
    elif dataset == "features":
        files = _files_fingerprint(options.get("path") or features_path, "**/*.parquet")
    elif dataset == table_data.NAME:
        files = table_data.fingerprint(options.get("path", ""))
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
    return digest.hexdigest()[:VERSION_CHARS]


# -- digits -------------------------------------------------------------------------------


def _digits(seed: int) -> DataSplits:
    data = digits.load(seed)
    (x_train, y_train), (x_val, y_val), (x_test, y_test) = (
        (data.x[rows], data.y[rows]) for rows in (data.train, data.val, data.test)
    )
    splits = (x_train, y_train, x_val, y_val, x_test, y_test)
    return _classification("digits", splits, digits.CLASSES, source=data.source, split=data.split)


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
    limit = int_option(options, "limit", default=0, minimum=1)
    if limit:
        x_train, y_train = x_train[:limit], y_train[:limit]
    val_fraction = fraction_option(options, "val_fraction", MNIST_VAL_FRACTION)
    train, val, _ = stratified_split(y_train, val_fraction, 0.0, seed)
    # 10 digits, or more for IDX sets with more classes (EMNIST letters).
    n_classes = max(10, int(max(y_train.max(), y_test.max())) + 1)
    splits = (x_train[train], y_train[train], x_train[val], y_train[val], x_test, y_test)
    return _classification(
        "mnist",
        splits,
        n_classes,
        source=str(root),
        split=f"t10k for test, stratified {val_fraction:.3g} of train for validation, seed {seed}",
    )


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
    split: str,
) -> DataSplits:
    """Splits ordered (x_train, y_train, x_val, y_val, x_test, y_test); the
    version is a hash of exactly these arrays."""
    return DataSplits(
        name=name,
        version=digest_arrays(*splits),
        task=TASK_CLASSIFICATION,
        x_train=splits[0],
        y_train=splits[1],
        x_val=splits[2],
        y_val=splits[3],
        x_test=splits[4],
        y_test=splits[5],
        n_classes=n_classes,
        source=source,
        split=split,
    )
