"""The trainer's datasets: IDX files, digits, MNIST and the Parquet feature store."""

from __future__ import annotations

import gzip
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from google.protobuf import json_format
from numpy.typing import NDArray

from shared.contracts.aistack.v1 import models_pb2
from shared.distribution import LEVELS
from shared.feature_store import FEATURE_STATS, OFFLINE_COLUMNS, partition_path
from svc_trainer.data.datasets import cache_key, load
from svc_trainer.data.features import feature_names, load_features
from svc_trainer.data.idx import read_idx, write_idx
from svc_trainer.evaluation import prepare
from svc_trainer.plan import TASK_CLASSIFICATION, TASK_REGRESSION, DataSplits, TrialError

# -- IDX --------------------------------------------------------------------------------

# Each dtype's extremes, a negative zero, NaN and infinities where they exist.
IDX_VALUES: list[tuple[type[np.generic], list[float]]] = [
    (np.uint8, [0, 1, 127, 128, 255, 7]),
    (np.int8, [-128, -1, 0, 1, 127, 5]),
    (np.int16, [-32768, -1, 0, 258, 32767, 5]),
    (np.int32, [-(2**31), -1, 0, 65536, 2**31 - 1, 5]),
    (np.float32, [-3.4e38, -0.0, 1.5, 1e-45, np.inf, np.nan]),
    (np.float64, [-1.7e308, -0.0, 0.1, 5e-324, -np.inf, np.nan]),
]


@pytest.mark.parametrize(("dtype", "values"), IDX_VALUES)
@pytest.mark.parametrize("name", ["data.idx", "data.idx.gz"])
def test_idx_round_trips_every_dtype_plain_and_gzipped(
    tmp_path: Path, dtype: type[np.generic], values: list[float], name: str
) -> None:
    array = np.array(values, dtype=dtype).reshape(2, 3)
    path = tmp_path / name
    write_idx(path, array)
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype)
    assert back.shape == (2, 3)
    assert back.dtype.isnative and back.flags.writeable
    assert back.tobytes() == array.tobytes()  # bit for bit: NaN and -0.0 too
    assert path.read_bytes()[:2] == (b"\x1f\x8b" if name.endswith(".gz") else b"\x00\x00")


def test_idx_bytes_are_the_mnist_layout(tmp_path: Path) -> None:
    write_idx(tmp_path / "a", np.array([[1, 2, 3], [4, 5, 6]], dtype=np.uint8))
    assert (tmp_path / "a").read_bytes() == bytes.fromhex("00000802 00000002 00000003 010203040506")
    # Multi-byte items are big-endian whatever the machine is.
    write_idx(tmp_path / "b", np.array([258, -2], dtype=np.int16))
    assert (tmp_path / "b").read_bytes() == bytes.fromhex("00000B01 00000002 0102 FFFE")
    write_idx(tmp_path / "c", np.array([1.5], dtype=np.float32))
    assert (tmp_path / "c").read_bytes() == bytes.fromhex("00000D01 00000001") + struct.pack(
        ">f", 1.5
    )


def test_idx_reads_big_endian_input_and_zero_dimensions(tmp_path: Path) -> None:
    (tmp_path / "be").write_bytes(bytes.fromhex("00000C01 00000002 00000001 FFFFFFFF"))
    np.testing.assert_array_equal(read_idx(tmp_path / "be"), np.array([1, -1], dtype=np.int32))
    write_idx(tmp_path / "empty", np.zeros((0, 28, 28), dtype=np.uint8))
    assert read_idx(tmp_path / "empty").shape == (0, 28, 28)


def test_idx_gzip_is_recognised_by_content_not_name(tmp_path: Path) -> None:
    raw = bytes.fromhex("00000801 00000003 070809")
    (tmp_path / "labels").write_bytes(gzip.compress(raw))
    np.testing.assert_array_equal(read_idx(tmp_path / "labels"), np.array([7, 8, 9], np.uint8))


def test_idx_writer_refuses_dtypes_idx_cannot_hold(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="int64"):
        write_idx(tmp_path / "x", np.array([1, 2], dtype=np.int64))


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (bytes.fromhex("0100080100000001 07"), "bad magic 01000801"),
        (bytes.fromhex("0000070100000001 07"), "unknown dtype code 0x07"),
        (bytes.fromhex("0000"), "truncated: 2 bytes"),
        (bytes.fromhex("00000802 00000002"), "truncated inside its header"),
        (bytes.fromhex("00000802 00000002 00000002 010203"), "needs 4 data bytes, found 3"),
        (bytes.fromhex("00000B01 00000002 000100"), "needs 4 data bytes, found 3"),
        (bytes.fromhex("00000801 00000002 010203"), "trailing bytes"),
        (gzip.compress(bytes.fromhex("00000801 00000003 070809"), mtime=0)[:-6], "gzip"),
        (b"\x1f\x8bnot gzip at all", "gzip"),
    ],
)
def test_malformed_idx_files_are_bad_datasets_naming_file_and_problem(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "broken-idx1-ubyte"
    path.write_bytes(content)
    with pytest.raises(TrialError) as caught:
        read_idx(path)
    assert caught.value.reason == "bad_dataset"
    assert str(path) in caught.value.message
    assert problem in caught.value.message


def test_a_missing_idx_file_is_a_bad_dataset(tmp_path: Path) -> None:
    with pytest.raises(TrialError, match="cannot be read") as caught:
        read_idx(tmp_path / "nope")
    assert caught.value.reason == "bad_dataset"


# -- digits -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits() -> DataSplits:
    return load("digits", {})


def test_digits_shapes_dtypes_and_scale(digits: DataSplits) -> None:
    assert (digits.name, digits.task, digits.n_classes) == ("digits", TASK_CLASSIFICATION, 10)
    # 1797 images: 20 % (359) validation, 20 % test, the rest training.
    assert digits.x_train.shape == (1079, 8, 8)
    assert digits.x_val.shape == (359, 8, 8)
    assert digits.x_test.shape == (359, 8, 8)
    for x, y in split_pairs(digits):
        assert x.dtype == np.float32 and y.dtype == np.int64
        assert len(x) == len(y)
    everything = np.concatenate([digits.x_train, digits.x_val, digits.x_test])
    assert everything.min() == 0.0 and everything.max() == 1.0
    # Pixel values are sixteenths.
    np.testing.assert_array_equal(everything * 16, np.round(everything * 16))
    assert digits.source.startswith("sklearn digits 1.")
    assert len(digits.version) == 16 and digits.offsets == ()


def test_digits_splits_cover_every_image_once(digits: DataSplits) -> None:
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]

    original = load_digits()
    expected = sorted_rows(original.images / 16.0, original.target)
    got = sorted_rows(
        np.concatenate([digits.x_train, digits.x_val, digits.x_test]),
        np.concatenate([digits.y_train, digits.y_val, digits.y_test]),
    )
    assert got == expected


def test_digits_splits_are_stratified(digits: DataSplits) -> None:
    total = np.bincount(np.concatenate([digits.y_train, digits.y_val, digits.y_test]))
    for y, share in [(digits.y_val, 0.2), (digits.y_test, 0.2), (digits.y_train, 0.6)]:
        per_class = np.bincount(y, minlength=10)
        assert np.all(np.abs(per_class - share * total) <= 1.5), (per_class, share * total)


def test_digits_same_seed_same_bytes_other_seed_other_rows(digits: DataSplits) -> None:
    again = load("digits", {"path": "ignored"}, seed=0)
    for mine, theirs in zip(split_arrays(digits), split_arrays(again), strict=True):
        assert mine.tobytes() == theirs.tobytes()
    assert again.version == digits.version

    other = load("digits", {}, seed=1)
    assert other.x_train.shape == digits.x_train.shape
    assert not np.array_equal(other.x_train, digits.x_train)
    assert not np.array_equal(other.y_test, digits.y_test)
    assert other.version != digits.version
    # The same images, dealt differently.
    assert sorted_rows(
        np.concatenate([other.x_train, other.x_val, other.x_test]),
        np.concatenate([other.y_train, other.y_val, other.y_test]),
    ) == sorted_rows(
        np.concatenate([digits.x_train, digits.x_val, digits.x_test]),
        np.concatenate([digits.y_train, digits.y_val, digits.y_test]),
    )


def test_unknown_dataset_names_the_known_ones() -> None:
    with pytest.raises(TrialError) as caught:
        load("cifar10", {})
    assert caught.value.reason == "unknown_dataset"
    assert "'cifar10'" in caught.value.message
    assert "digits, mnist, features" in caught.value.message


# -- mnist ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeMnist:
    root: Path
    train_images: NDArray[np.uint8]
    train_labels: NDArray[np.uint8]
    test_images: NDArray[np.uint8]
    test_labels: NDArray[np.uint8]


@pytest.fixture
def mnist(tmp_path: Path) -> FakeMnist:
    """60 training and 20 test 28x28 images, 6 and 2 of each digit; two files gzipped."""
    rng = np.random.default_rng(42)
    fake = FakeMnist(
        root=tmp_path / "mnist",
        train_images=rng.integers(0, 256, (60, 28, 28), dtype=np.uint8),
        train_labels=np.tile(np.arange(10, dtype=np.uint8), 6),
        test_images=rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
        test_labels=np.repeat(np.arange(10, dtype=np.uint8), 2),
    )
    fake.root.mkdir()
    write_idx(fake.root / "train-images-idx3-ubyte.gz", fake.train_images)
    write_idx(fake.root / "train-labels-idx1-ubyte", fake.train_labels)
    write_idx(fake.root / "t10k-images-idx3-ubyte", fake.test_images)
    write_idx(fake.root / "t10k-labels-idx1-ubyte.gz", fake.test_labels)
    return fake


def test_mnist_test_split_is_t10k_scaled_to_unit_range(mnist: FakeMnist) -> None:
    splits = load("mnist", {"path": str(mnist.root)})
    assert (splits.name, splits.task, splits.n_classes) == ("mnist", TASK_CLASSIFICATION, 10)
    assert splits.source == str(mnist.root)
    assert splits.x_test.dtype == np.float32 and splits.y_test.dtype == np.int64
    np.testing.assert_array_equal(splits.x_test, mnist.test_images.astype(np.float32) / 255)
    np.testing.assert_array_equal(splits.y_test, mnist.test_labels)
    assert splits.x_test[0, 0, 0] == np.float32(mnist.test_images[0, 0, 0] / 255)


def test_mnist_validation_is_a_stratified_sixth_of_train(mnist: FakeMnist) -> None:
    splits = load("mnist", {"path": str(mnist.root)})
    assert splits.x_train.shape == (50, 28, 28) and splits.x_val.shape == (10, 28, 28)
    assert sorted(splits.y_val.tolist()) == list(range(10))
    assert np.bincount(splits.y_train).tolist() == [5] * 10
    # Every training image went to exactly one of the two, with its own label.
    dealt = np.concatenate([splits.x_train, splits.x_val])
    labels = np.concatenate([splits.y_train, splits.y_val])
    assert sorted_rows(dealt, labels) == sorted_rows(mnist.train_images / 255, mnist.train_labels)


def test_mnist_seed_moves_rows_but_is_reproducible(mnist: FakeMnist) -> None:
    first = load("mnist", {"path": str(mnist.root)}, seed=3)
    again = load("mnist", {"path": str(mnist.root)}, seed=3)
    other = load("mnist", {"path": str(mnist.root)}, seed=4)
    assert first.x_val.tobytes() == again.x_val.tobytes()
    assert first.version == again.version
    assert first.x_val.tobytes() != other.x_val.tobytes()
    assert first.version != other.version
    np.testing.assert_array_equal(first.x_test, other.x_test)


def test_mnist_limit_and_val_fraction(mnist: FakeMnist) -> None:
    splits = load("mnist", {"path": str(mnist.root), "limit": "20", "val_fraction": "0.5"})
    assert (len(splits.y_train), len(splits.y_val), len(splits.y_test)) == (10, 10, 20)
    # The first 20 rows hold two of each digit: one of each on each side.
    assert sorted(splits.y_val.tolist()) == list(range(10))
    kept = sorted_rows(
        np.concatenate([splits.x_train, splits.x_val]),
        np.concatenate([splits.y_train, splits.y_val]),
    )
    assert kept == sorted_rows(mnist.train_images[:20] / 255, mnist.train_labels[:20])


def test_mnist_keeps_the_files_image_size_and_larger_label_sets(tmp_path: Path) -> None:
    write_idx(tmp_path / "train-images-idx3-ubyte", np.full((12, 5, 7), 255, np.uint8))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.arange(12, dtype=np.uint8) % 12)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((3, 5, 7), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([0, 1, 25], np.uint8))
    splits = load("mnist", {"path": str(tmp_path)})
    assert splits.x_train.shape[1:] == (5, 7)
    assert splits.n_classes == 26
    assert np.all(splits.x_train == 1.0)


def test_mnist_missing_file_is_named(mnist: FakeMnist) -> None:
    (mnist.root / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(TrialError) as caught:
        load("mnist", {"path": str(mnist.root)})
    assert caught.value.reason == "bad_dataset"
    assert "missing t10k-labels-idx1-ubyte[.gz]" in caught.value.message
    assert "train-" not in caught.value.message


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, 'needs options["path"]'),
        ({"limit": "ten"}, 'options["limit"]'),
        ({"limit": "0"}, "expected >= 1"),
        ({"val_fraction": "1.5"}, "expected 0 < value < 1"),
    ],
)
def test_mnist_bad_options(mnist: FakeMnist, options: dict[str, str], message: str) -> None:
    full = {"path": str(mnist.root), **options} if options else {}
    with pytest.raises(TrialError) as caught:
        load("mnist", full)
    assert caught.value.reason == "bad_dataset"
    assert message in caught.value.message


def test_mnist_images_and_labels_must_agree(mnist: FakeMnist) -> None:
    write_idx(mnist.root / "train-labels-idx1-ubyte", np.zeros(59, np.uint8))
    with pytest.raises(TrialError, match=r"has 60 images but .* has 59 labels") as caught:
        load("mnist", {"path": str(mnist.root)})
    assert caught.value.reason == "bad_dataset"


def test_mnist_rejects_a_malformed_file(mnist: FakeMnist) -> None:
    (mnist.root / "t10k-images-idx3-ubyte").write_bytes(bytes.fromhex("00000803 00000014"))
    with pytest.raises(TrialError, match="t10k-images-idx3-ubyte is truncated") as caught:
        load("mnist", {"path": str(mnist.root)})
    assert caught.value.reason == "bad_dataset"


# -- features ---------------------------------------------------------------------------

T0 = datetime(2026, 11, 22, 23, 56, tzinfo=UTC)
TUMBLING = "tumbling-60s"
#: The offline store's ``sources`` column, as Spark writes it.
SOURCES = pa.list_(
    pa.struct(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("min_offset", pa.int64()),
            ("max_offset", pa.int64()),
            ("count", pa.int64()),
        ]
    )
)


@dataclass(frozen=True)
class Window:
    """One row of svc_transform's offline store (the partition columns aside)."""

    entity_id: str
    index: int  # window start = T0 + index * slide
    mean: float
    stddev: float | None = None
    metric: str = "temperature"
    window: str = TUMBLING
    batch: int = 0
    path: str = ""
    unit: str = "C"
    size: int = 60
    slide: int = 60

    @property
    def start(self) -> datetime:
        return T0 + timedelta(seconds=self.index * self.slide)

    def spread(self) -> tuple[float, float]:
        return self.mean - 1, self.mean + 1

    @property
    def count(self) -> int:
        return 5 + self.index

    def source(self) -> dict[str, Any]:
        """Its clean events, on partition 0 (offsets are arbitrary here)."""
        first = 100 * self.index
        return {
            "topic": "aistack.events.clean",
            "partition": 0,
            "min_offset": first,
            "max_offset": first + self.count - 1,
            "count": self.count,
        }


def expected_features(window: Window) -> list[float]:
    low, high = window.spread()
    return [window.mean, window.stddev or 0.0, low, high, window.count, window.mean + 0.125,
            window.mean + 0.875]  # fmt: skip


def write_store(
    root: Path, windows: Sequence[Window], *, int96: bool = True, sources: bool = True
) -> None:
    """``windows`` as svc_transform's WindowSink writes them: one Parquet file per
    date/metric/window/batch partition, Spark's column names and types (without
    ``sources``, as it wrote them before it had the column)."""
    groups: dict[tuple[str, str, str, int], list[Window]] = {}
    for w in windows:
        groups.setdefault((w.start.strftime("%Y-%m-%d"), w.metric, w.window, w.batch), []).append(w)
    for (date, metric, window, batch), rows in groups.items():
        folder = root / partition_path(date=date, metric=metric, window=window, batch=batch)
        folder.mkdir(parents=True, exist_ok=True)
        table = window_table(rows)
        pq.write_table(
            table if sources else table.drop_columns(["sources"]),
            folder / f"part-00000-{len(list(folder.iterdir())):04d}.c000.snappy.parquet",
            use_deprecated_int96_timestamps=int96,
        )
    (root / "_SUCCESS").touch()


def window_table(rows: Sequence[Window]) -> Any:
    timestamp = pa.timestamp("us", tz="UTC")
    columns: Mapping[str, tuple[Any, list[Any]]] = {
        "window_key": (pa.string(), [f"{w.entity_id}|{w.index}" for w in rows]),
        "entity_id": (pa.string(), [w.entity_id for w in rows]),
        "path": (pa.string(), [w.path for w in rows]),
        "unit": (pa.string(), [w.unit for w in rows]),
        "window_start": (timestamp, [w.start for w in rows]),
        "window_end": (timestamp, [w.start + timedelta(seconds=w.size) for w in rows]),
        "window_size": (pa.int64(), [w.size for w in rows]),
        "window_slide": (pa.int64(), [w.slide for w in rows]),
        "count": (pa.int64(), [w.count for w in rows]),
        "mean": (pa.float64(), [w.mean for w in rows]),
        "min": (pa.float64(), [w.spread()[0] for w in rows]),
        "max": (pa.float64(), [w.spread()[1] for w in rows]),
        "stddev": (pa.float64(), [w.stddev for w in rows]),
        "last": (pa.float64(), [w.mean for w in rows]),
        "p50": (pa.float64(), [w.mean + 0.125 for w in rows]),
        "p95": (pa.float64(), [w.mean + 0.875 for w in rows]),
        "error_rate": (pa.float64(), [None for _ in rows]),
        "last_event_time": (timestamp, [w.start + timedelta(seconds=59) for w in rows]),
        "sources": (SOURCES, [[w.source()] for w in rows]),
    }
    assert tuple(columns) == OFFLINE_COLUMNS  # the layout svc_transform writes
    return pa.table({name: pa.array(values, kind) for name, (kind, values) in columns.items()})


def series(entity: str, count: int, **fields: Any) -> list[Window]:
    """``count`` consecutive windows of one entity; window i has mean 10 + i,
    stddev i / 2 (none for the first: Spark's null), batch i // 4."""
    return [
        Window(entity, i, 10.0 + i, stddev=(i / 2 or None), batch=i // 4, **fields)
        for i in range(count)
    ]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "features" / "windows"
    write_store(root, series("sensor-1", 13))
    return root


def test_feature_columns_are_lags_oldest_first() -> None:
    names = feature_names(FEATURE_STATS, 2)
    assert names == [
        "mean_lag2", "stddev_lag2", "min_lag2", "max_lag2", "count_lag2", "p50_lag2", "p95_lag2",
        "mean_lag1", "stddev_lag1", "min_lag1", "max_lag1", "count_lag1", "p50_lag1", "p95_lag1",
    ]  # fmt: skip


@pytest.mark.parametrize("int96", [True, False], ids=["int96", "timestamp_micros"])
def test_features_are_the_previous_windows_and_the_target_the_next_mean(
    tmp_path: Path, int96: bool
) -> None:
    windows = series("sensor-1", 13)
    write_store(tmp_path, windows, int96=int96)
    splits = load("features", {"path": str(tmp_path)})
    assert (splits.name, splits.task, splits.n_classes) == ("features", TASK_REGRESSION, 0)
    assert splits.x_train.dtype == np.float32 and splits.y_train.dtype == np.float32
    # 13 windows, 3 lags: targets are windows 3..12, split 7 / 1 / 2 in time.
    assert splits.x_train.shape == (7, 21)
    assert (len(splits.y_val), len(splits.y_test)) == (1, 2)
    # By hand: the first example is windows 0, 1, 2 (window 0's null stddev is 0).
    np.testing.assert_allclose(
        splits.x_train[0],
        [10, 0, 9, 11, 5, 10.125, 10.875,
         11, 0.5, 10, 12, 6, 11.125, 11.875,
         12, 1.0, 11, 13, 7, 12.125, 12.875],
    )  # fmt: skip
    assert splits.y_train[0] == 13.0
    targets = np.concatenate([splits.y_train, splits.y_val, splits.y_test])
    np.testing.assert_array_equal(targets, [10.0 + i for i in range(3, 13)])
    for n, example in enumerate(np.concatenate([splits.x_train, splits.x_val, splits.x_test])):
        lagged = [expected_features(windows[n + k]) for k in range(3)]
        np.testing.assert_allclose(example, np.concatenate(lagged), rtol=1e-6)
    assert splits.source == str(tmp_path)
    assert splits.offsets == ()
    assert len(splits.version) == 16
    assert splits.feature == ""  # three lags: the online store cannot feed it


def test_the_label_is_the_next_windows_statistic_the_user_chooses(tmp_path: Path) -> None:
    write_store(tmp_path, series("sensor-1", 13))
    mean = load("features", {"path": str(tmp_path)})
    peak = load("features", {"path": str(tmp_path), "label": "max"})
    # The same examples; the targets the next windows' max (mean + 1) instead.
    np.testing.assert_array_equal(peak.x_train, mean.x_train)
    np.testing.assert_array_equal(peak.y_train, mean.y_train + 1.0)
    assert peak.label == "max of the next temperature window" and peak.version != mean.version
    assert mean.label == "mean of the next temperature window"
    assert mean.feature_names[:2] == ("mean_lag3", "stddev_lag3")
    assert mean.split == "chronological 70/15/15"
    with pytest.raises(TrialError, match="expected a window statistic"):
        load("features", {"path": str(tmp_path), "label": "median"})


def test_features_lags_option(store: Path) -> None:
    splits = load("features", {"lags": "1"}, features_path=str(store))
    # 12 examples: windows 1..12 predicted from the one before.
    assert splits.x_train.shape == (8, 7)
    np.testing.assert_allclose(splits.x_train[:, 0] + 1, splits.y_train)
    np.testing.assert_array_equal(splits.y_test, [21.0, 22.0])
    # One lag: svc_model can feed it the latest window of this online-store field.
    assert splits.feature == "temperature@tumbling-60s"


@pytest.mark.parametrize("old_first", [True, False], ids=["old-files-first", "new-files-first"])
def test_features_read_a_store_written_before_it_had_sources(
    tmp_path: Path, old_first: bool
) -> None:
    windows = series("sensor-1", 13)
    old, new = (windows[:8], windows[8:]) if old_first else (windows[5:], windows[:5])
    write_store(tmp_path / "mixed", old, sources=False)
    write_store(tmp_path / "mixed", new)
    write_store(tmp_path / "current", windows)
    files = sorted((tmp_path / "mixed").rglob("*.parquet"))
    assert {"sources" in pq.read_schema(file).names for file in files} == {True, False}

    mixed = load("features", {"path": str(tmp_path / "mixed")})
    current = load("features", {"path": str(tmp_path / "current")})

    for got, want in zip(split_arrays(mixed), split_arrays(current), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_replayed_batch_keeps_the_latest_rows(tmp_path: Path) -> None:
    windows = series("sensor-1", 13)
    # Batch 9 wrote window 5 again after a restart, with what it computed then.
    rewritten = replace(windows[5], batch=9, mean=100.0, stddev=7.0)
    write_store(tmp_path, [*windows, rewritten])
    splits = load("features", {"path": str(tmp_path)})
    x = np.concatenate([splits.x_train, splits.x_val, splits.x_test])
    y = np.concatenate([splits.y_train, splits.y_val, splits.y_test])
    assert len(y) == 10  # window 5 counted once
    assert y[2] == 100.0  # the target of the third example is window 5
    # Windows 6, 7, 8 see window 5 as their lag 1, 2, 3 (offsets 14, 7, 0).
    assert x[3, 14] == 100.0 and x[3, 15] == 7.0
    assert x[4, 7] == 100.0 and x[5, 0] == 100.0
    assert 15.0 not in x[:, [0, 7, 14]]


def test_gaps_and_other_series_never_make_an_example(tmp_path: Path) -> None:
    # Window 6 of sensor-1 is missing (no events); /b is another series of web-1.
    sensor = [w for w in series("sensor-1", 13) if w.index != 6]
    web_a = series("web-1", 5, metric="temperature", path="/a")
    web_b = [replace(w, mean=w.mean + 1000) for w in series("web-1", 5, path="/b")]
    write_store(tmp_path, [*sensor, *web_a, *web_b])
    splits = load("features", {"path": str(tmp_path)})
    y = sorted(np.concatenate([splits.y_train, splits.y_val, splits.y_test]).tolist())
    # sensor-1: targets 3, 4, 5 and 10, 11, 12 (6..9 would need window 6); web-1: 3, 4 per path.
    assert y == sorted([13, 14, 15, 20, 21, 22, 13, 14, 1013, 1014])


def test_the_split_is_chronological_and_never_cuts_through_one_window(tmp_path: Path) -> None:
    # Two series with the same 13 windows: 20 examples over 10 target windows.
    write_store(tmp_path, [*series("web-1", 13, path="/a"), *series("web-1", 13, path="/b")])
    splits = load("features", {"path": str(tmp_path)})
    # 70 % is 14 examples (7 windows); 85 % is 17, inside window 11: the cut moves to 16.
    assert (len(splits.y_train), len(splits.y_val), len(splits.y_test)) == (14, 2, 4)
    assert sorted(set(splits.y_train.tolist())) == [13.0 + i for i in range(7)]
    assert splits.y_val.tolist() == [20.0, 20.0]
    assert sorted(set(splits.y_test.tolist())) == [21.0, 22.0]


def test_features_choose_metric_and_window(tmp_path: Path) -> None:
    humidity = [replace(w, mean=w.mean * 2) for w in series("s", 13, metric="humidity")]
    sliding = series("s", 14, window="sliding-120s-every-60s", size=120)
    write_store(tmp_path, [*series("s", 13), *humidity, *sliding])
    path = str(tmp_path)
    assert load("features", {"path": path, "metric": "humidity"}).y_test.tolist() == [42.0, 44.0]
    temperature = load("features", {"path": path, "metric": "temperature", "window": TUMBLING})
    assert temperature.y_test.tolist() == [21.0, 22.0]
    slide = load("features", {"path": path, "metric": "temperature", "window": sliding[0].window})
    assert slide.y_test.tolist() == [22.0, 23.0] and len(slide.y_train) == 7
    assert slide.version != temperature.version


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, 'set options["metric"] to one of: humidity, temperature'),
        ({"metric": "pressure"}, "no metric 'pressure'; it has: humidity, temperature"),
        ({"metric": "temperature"}, 'set options["window"] to one of: sliding-'),
        ({"metric": "humidity", "window": "tumbling-5s"}, "it has: tumbling-60s"),
        ({"metric": "humidity", "lags": "0"}, 'options["lags"]=0: expected >= 1'),
        ({"metric": "humidity", "lags": "12"}, "gives 1 examples"),
    ],
)
def test_features_option_errors(tmp_path: Path, options: dict[str, str], message: str) -> None:
    write_store(
        tmp_path,
        [
            *series("s", 13),
            *series("s", 13, metric="humidity"),
            *series("s", 13, window="sliding-120s-every-60s", size=120),
        ],
    )
    with pytest.raises(TrialError) as caught:
        load("features", {"path": str(tmp_path), **options})
    assert caught.value.reason == "bad_dataset"
    assert message in caught.value.message


def test_too_few_windows_is_a_clear_error(tmp_path: Path) -> None:
    write_store(tmp_path, series("sensor-1", 12))
    with pytest.raises(TrialError) as caught:
        load("features", {"path": str(tmp_path)})
    assert caught.value.reason == "bad_dataset"
    assert "gives 9 examples of temperature @ tumbling-60s with 3 lags" in caught.value.message
    assert "at least 10" in caught.value.message


def test_missing_store_is_a_bad_dataset(tmp_path: Path) -> None:
    for options, features_path, message in [
        ({}, "", 'needs options["path"]'),
        ({"path": str(tmp_path / "nowhere")}, "", "does not exist"),
        ({}, str(tmp_path / "nowhere"), "nowhere does not exist"),
        ({}, str(tmp_path), "holds no Parquet files"),
    ]:
        with pytest.raises(TrialError) as caught:
            load("features", options, features_path=features_path)
        assert caught.value.reason == "bad_dataset"
        assert message in caught.value.message


def test_features_version_follows_the_files(store: Path) -> None:
    first = load("features", {}, features_path=str(store))
    again = load("features", {}, features_path=str(store), seed=5)
    assert first.version == again.version
    assert first.x_train.tobytes() == again.x_train.tobytes()
    assert load("features", {"lags": "2"}, features_path=str(store)).version != first.version
    write_store(store, [Window("sensor-1", 13, 23.0, batch=9)])
    grown = load("features", {}, features_path=str(store))
    assert grown.version != first.version
    assert grown.y_test.tolist() == [22.0, 23.0]
    # The lineage names every file read, the new one too.
    files = sorted(str(path) for path in store.rglob("*.parquet"))
    assert list(grown.files) == files and len(first.files) == len(files) - 1


def rfc3339(index: int) -> str:
    """Window ``index``'s start (60 s windows) as the tuner writes a bound."""
    return (T0 + timedelta(minutes=index)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_window_bounds_read_only_the_windows_starting_between_them(tmp_path: Path) -> None:
    write_store(tmp_path, series("sensor-1", 30))
    path = str(tmp_path)
    bounded = {"path": path, "window_from": rfc3339(5), "window_to": rfc3339(20)}
    splits = load("features", bounded)
    x = np.concatenate([splits.x_train, splits.x_val, splits.x_test])
    y = np.concatenate([splits.y_train, splits.y_val, splits.y_test])
    # Windows 5..20 read: 3 lags make targets 8..20, and every lag is window 5 or later.
    assert sorted(y.tolist()) == [10.0 + i for i in range(8, 21)]
    assert x[:, [0, 7, 14]].min() == 15.0 and x[:, 14].max() == 29.0
    # Both bounds are inclusive; a lone bound leaves the other side open.
    only_from = load("features", {"path": path, "window_from": rfc3339(17)})
    assert np.concatenate([only_from.y_train, only_from.y_val, only_from.y_test]).min() == 30.0
    only_to = load("features", {"path": path, "window_to": rfc3339(14)})
    assert np.concatenate([only_to.y_train, only_to.y_val, only_to.y_test]).max() == 24.0
    # Another offset names the same instant: the same windows.
    two_hours_east = timezone(timedelta(hours=2))
    moment = (T0 + timedelta(minutes=5)).astimezone(two_hours_east)
    shifted = {**bounded, "window_from": moment.isoformat()}
    assert load("features", shifted).y_test.tolist() == splits.y_test.tolist()
    # The version is a function of what was read: the bounds are part of it.
    unbounded = load("features", {"path": path})
    assert len({splits.version, only_from.version, only_to.version, unbounded.version}) == 4
    assert load("features", bounded).version == splits.version
    assert cache_key("features", bounded) != cache_key("features", {"path": path})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"window_from": "yesterday"},
            "options[\"window_from\"]='yesterday': expected an RFC 3339",
        ),
        ({"window_to": "2026-11-24T10:00:00"}, 'options["window_to"]='),
        ({"window_to": "2026-11-24T10:00:00"}, "has no time zone"),
        (
            {"window_from": "2026-11-24T10:00:00Z", "window_to": "2026-11-24T09:00:00Z"},
            'options["window_from"]=\'2026-11-24T10:00:00Z\' is after options["window_to"]',
        ),
        # Bounds that leave too few windows say so.
        ({"window_from": rfc3339(0), "window_to": rfc3339(9)}, "window_to " + rfc3339(9)),
    ],
)
def test_bad_window_bounds_are_bad_datasets_naming_the_option(
    store: Path, options: dict[str, str], message: str
) -> None:
    with pytest.raises(TrialError) as caught:
        load("features", {"path": str(store), **options})
    assert caught.value.reason == "bad_dataset"
    assert message in caught.value.message


def test_a_read_up_to_window_to_waits_for_the_store_to_reach_it(tmp_path: Path) -> None:
    windows = series("sensor-1", 21)
    write_store(tmp_path, windows[:13])
    options = {"path": str(tmp_path), "window_to": rfc3339(20)}
    # Windows 13..20 land a moment later, in a later batch, as Spark commits
    # them: written aside, then renamed into place whole.
    late = [replace(w, batch=9) for w in windows[13:]]
    staging = tmp_path.parent / "staging"
    write_store(staging, late)
    batch = partition_path(date=late[0].start.strftime("%Y-%m-%d"), metric=late[0].metric,
                           window=late[0].window, batch=9)  # fmt: skip
    assert all(w.start.date() == late[0].start.date() for w in late)
    (tmp_path / batch).parent.mkdir(parents=True, exist_ok=True)
    writer = threading.Timer(0.5, (staging / batch).rename, args=(tmp_path / batch,))
    writer.start()
    try:
        splits = load_features(options, "", catch_up_seconds=30)
    finally:
        writer.join()
    assert np.concatenate([splits.y_train, splits.y_val, splits.y_test]).max() == 30.0


def test_a_store_that_never_reaches_window_to_is_a_clear_error(store: Path) -> None:
    with pytest.raises(TrialError) as caught:
        load_features({"path": str(store), "window_to": rfc3339(20)}, "", catch_up_seconds=0)
    assert caught.value.reason == "bad_dataset"
    assert f"windows up to {rfc3339(12)}, not yet window_to {rfc3339(20)}" in caught.value.message


def test_the_training_distribution_is_the_lag1_windows_of_the_training_split(
    store: Path,
) -> None:
    splits = load("features", {}, features_path=str(store))
    got = json_format.Parse(splits.distribution, models_pb2.TrainingDistribution())
    assert (got.feature, got.metric, got.window) == (
        "temperature@tumbling-60s",
        "temperature",
        TUMBLING,
    )
    assert [s.statistic for s in got.statistics] == list(FEATURE_STATS)
    # Targets 3..9 train; their lag-1 windows are 2..8 (x's *_lag1 columns).
    lag1 = splits.x_train[:, -len(FEATURE_STATS) :].astype(np.float64)
    np.testing.assert_allclose(lag1[:, 0], [10.0 + i for i in range(2, 9)])
    for column, reference in enumerate(got.statistics):
        assert tuple(reference.levels) == LEVELS
        assert reference.windows == len(splits.y_train) == 7
        np.testing.assert_allclose(reference.quantiles, np.quantile(lag1[:, column], LEVELS))
    assert got.first_window_start.ToDatetime(UTC) == T0 + timedelta(minutes=2)
    assert got.last_window_start.ToDatetime(UTC) == T0 + timedelta(minutes=8)

    # A refit trains on training + validation: its distribution covers both.
    refit = prepare(splits, {"refit": "true"})
    both = json_format.Parse(refit.distribution, models_pb2.TrainingDistribution())
    assert both == json_format.Parse(splits.train_val_distribution, both.__class__())
    assert both.statistics[0].windows == 8 and both.statistics[0].quantiles[-1] == 19.0
    assert both.last_window_start.ToDatetime(UTC) == T0 + timedelta(minutes=9)
    assert prepare(splits, {}).distribution == splits.distribution


def test_the_training_distribution_follows_the_window_bounds(tmp_path: Path) -> None:
    write_store(tmp_path, series("sensor-1", 30))
    splits = load("features", {"path": str(tmp_path), "window_from": rfc3339(10)})
    got = json_format.Parse(splits.distribution, models_pb2.TrainingDistribution())
    # Windows 10..29, 3 lags: targets 13..29, 70 % of 17 -> 11 train, lag-1 windows 12..22.
    assert got.statistics[0].windows == len(splits.y_train) == 11
    assert got.first_window_start.ToDatetime(UTC) == T0 + timedelta(minutes=12)
    assert got.statistics[0].quantiles[0] == 22.0


def test_other_datasets_carry_no_distribution(digits: DataSplits) -> None:
    assert (digits.distribution, digits.train_val_distribution) == ("", "")


# -- helpers ----------------------------------------------------------------------------


def split_pairs(splits: DataSplits) -> list[tuple[NDArray[Any], NDArray[Any]]]:
    return [
        (splits.x_train, splits.y_train),
        (splits.x_val, splits.y_val),
        (splits.x_test, splits.y_test),
    ]


def split_arrays(splits: DataSplits) -> list[NDArray[Any]]:
    return [array for pair in split_pairs(splits) for array in pair]


def sorted_rows(x: NDArray[Any], y: NDArray[Any]) -> list[tuple[int, bytes]]:
    """The (label, float32 image bytes) multiset, order-free."""
    images = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    return sorted((int(label), row.tobytes()) for label, row in zip(y, images, strict=True))
