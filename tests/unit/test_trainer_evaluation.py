"""How a trial's data is used (refit, k-fold cross-validation) and the warm
executors' bookkeeping: dataset cache keys, when an executor is replaced,
and the trainer's background work. No broker, no framework."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from shared.artifacts import ArtifactStore
from svc_trainer import evaluation
from svc_trainer.background import InOrder, Uploads
from svc_trainer.data import datasets as data
from svc_trainer.executors.pool import Idle, Limits, replacement_reason
from svc_trainer.plan import (
    TASK_CLASSIFICATION,
    Channel,
    DataSplits,
    Hyperparams,
    RunResult,
    RunSpec,
    StopReason,
    TrialError,
)


def _splits(n_train: int = 60, n_val: int = 20, n_test: int = 20) -> DataSplits:
    rng = np.random.default_rng(0)
    total = n_train + n_val + n_test
    x = np.arange(total, dtype=np.float32).reshape(total, 1, 1)
    y = rng.integers(0, 4, size=total).astype(np.int64)
    return DataSplits(
        name="toy",
        version="v",
        task=TASK_CLASSIFICATION,
        x_train=x[:n_train],
        y_train=y[:n_train],
        x_val=x[n_train : n_train + n_val],
        y_val=y[n_train : n_train + n_val],
        x_test=x[n_train + n_val :],
        y_test=y[n_train + n_val :],
        n_classes=4,
    )


def _spec(tmp_path: Path, options: Mapping[str, str], epochs: int = 2) -> RunSpec:
    return RunSpec(
        trial_id="s/0",
        study_id="s",
        trial_number=0,
        attempt=1,
        dataset="toy",
        model_family="cnn",
        framework="fake",
        strategy="",
        world_size=1,
        epochs=epochs,
        hparams=Hyperparams(),
        seed=5,
        objective_metric="val_error",
        checkpoint_dir=str(tmp_path / "ckpt"),
        export_dir=str(tmp_path / "export"),
        tensorboard_dir=str(tmp_path / "tb"),
        options=dict(options),
    )


# ---- refit -------------------------------------------------------------------------


def test_a_refit_trains_on_train_and_validation_and_keeps_the_test_split() -> None:
    splits = _splits()
    refit = evaluation.prepare(splits, {"refit": "true"})
    assert len(refit.y_train) == len(splits.y_train) + len(splits.y_val)
    assert np.array_equal(refit.x_train, np.concatenate([splits.x_train, splits.x_val]))
    assert np.array_equal(refit.x_test, splits.x_test)
    assert evaluation.prepare(splits, {}) is splits
    assert evaluation.prepare(splits, {"refit": "false"}) is splits


# ---- folds -------------------------------------------------------------------------


def test_folds_hold_every_example_once_and_are_stratified() -> None:
    y = np.repeat(np.arange(10), [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])
    folds = evaluation.stratified_folds(y, 10, seed=0)
    every = np.concatenate(folds)
    assert sorted(every.tolist()) == list(range(len(y)))
    sizes = [len(f) for f in folds]
    assert max(sizes) - min(sizes) <= 1
    for label in range(10):
        per_fold = [int((y[f] == label).sum()) for f in folds]
        assert max(per_fold) - min(per_fold) <= 1, (label, per_fold)


def test_folds_depend_only_on_labels_folds_and_seed() -> None:
    y = np.random.default_rng(1).integers(0, 3, size=90)
    one = evaluation.stratified_folds(y, 5, seed=0)
    two = evaluation.stratified_folds(y.copy(), 5, seed=0)
    other = evaluation.stratified_folds(y, 5, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(one, two, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(one, other, strict=True))


@pytest.mark.parametrize("value", ["1", "x", "51", "-2"])
def test_a_bad_fold_count_is_refused(value: str) -> None:
    with pytest.raises(TrialError, match="cv_folds"):
        evaluation.cv_folds({"cv_folds": value})


class _Recorder:
    """A runner that scores each fold by a known rule and records what it saw."""

    name = "fake"

    def __init__(self, stop_at_fold: int = -1) -> None:
        self.seen: list[tuple[RunSpec, DataSplits]] = []
        self.stop_at_fold = stop_at_fold

    def warm_up(self, threads: int) -> None:
        pass

    def fresh_process(self, spec: RunSpec) -> bool:
        return False

    def release(self) -> None:
        pass

    def run(self, spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
        fold = len(self.seen)
        self.seen.append((spec, data))
        channel.started(0)
        if fold == self.stop_at_fold:
            channel.epoch(1, {"val_error": 0.5})
            return RunResult(epochs_completed=1, stopped=StopReason.PRUNE)
        for epoch in range(1, spec.epochs + 1):
            channel.epoch(epoch, {"val_error": 0.1 * fold})
        error = 0.1 * fold
        return RunResult(
            epochs_completed=spec.epochs,
            val_metrics={"val_error": error, "loss": 1.0},
            test_metrics={"test_error": error, "test_loss": 2.0},
        )


class _Channel:
    """Records what the trial's channel was told."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.steps: list[int] = []

    def started(self, resumed_from_step: int, note: str = "") -> None:
        self.starts.append(resumed_from_step)

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        self.steps.append(step)

    def stop_requested(self) -> StopReason:
        return StopReason.NONE


def test_cross_validation_trains_each_fold_on_the_others_and_averages(tmp_path: Path) -> None:
    splits = _splits()
    runner = _Recorder()
    channel = _Channel()
    result = evaluation.run(runner, _spec(tmp_path, {"cv_folds": "4"}), splits, channel)

    x_all, _ = evaluation.all_examples(splits)
    held_out = [set(d.x_test.ravel().tolist()) for _, d in runner.seen]
    assert len(held_out) == 4
    assert set().union(*held_out) == set(x_all.ravel().tolist())
    for (_, fold_data), test in zip(runner.seen, held_out, strict=True):
        assert not test & set(fold_data.x_train.ravel().tolist())
        assert len(fold_data.y_train) + len(test) == len(x_all)
    assert [s.checkpoint_dir for s, _ in runner.seen] == [
        str(tmp_path / "ckpt" / f"fold-{i}") for i in range(4)
    ]
    assert [s.seed for s, _ in runner.seen] == [5, 6, 7, 8]
    assert not any(s.export for s, _ in runner.seen)
    # One started for the whole trial, steps running on through the folds.
    assert channel.starts == [0]
    assert channel.steps == list(range(1, 9))
    assert result.val_metrics["val_error"] == pytest.approx(0.15)
    assert result.test_metrics["test_error"] == pytest.approx(0.15)
    assert [result.test_metrics[f"fold_{i}_error"] for i in range(4)] == pytest.approx(
        [0.0, 0.1, 0.2, 0.3]
    )
    assert result.epochs_completed == 8 and not result.export_format


def test_a_stop_during_cross_validation_ends_it_at_the_step_reached(tmp_path: Path) -> None:
    result = evaluation.run(
        _Recorder(stop_at_fold=2), _spec(tmp_path, {"cv_folds": "4"}), _splits(), _Channel()
    )
    assert result.stopped is StopReason.PRUNE
    assert result.epochs_completed == 2 * 2 + 1


def test_cross_validating_a_regression_is_refused(tmp_path: Path) -> None:
    from dataclasses import replace

    regression = replace(_splits(), task="regression")
    with pytest.raises(TrialError, match="classification"):
        evaluation.run(_Recorder(), _spec(tmp_path, {"cv_folds": "3"}), regression, _Channel())


# ---- the data cache ----------------------------------------------------------------


def test_a_cache_key_follows_the_options_a_dataset_reads_and_its_files(tmp_path: Path) -> None:
    key = data.cache_key("mnist", {"path": str(tmp_path), "limit": "10"})
    assert data.cache_key("mnist", {"path": str(tmp_path), "limit": "10", "refit": "true"}) == key
    assert data.cache_key("mnist", {"path": str(tmp_path), "limit": "20"}) != key
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"new")
    assert data.cache_key("mnist", {"path": str(tmp_path), "limit": "10"}) != key
    assert data.cache_key("digits", {}, seed=0) != data.cache_key("digits", {}, seed=1)


# ---- when an executor is replaced --------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "trials", "one_shot", "alive", "idle", "expected"),
    [
        (Limits(), 5, False, True, Idle(100, retiring=False), ""),
        (Limits(max_trials=5), 5, False, True, Idle(100, retiring=False), "ran 5 trials"),
        (Limits(max_trials=5), 4, False, True, Idle(100, retiring=False), ""),
        (Limits(max_memory_bytes=2 << 20), 1, False, True, Idle(3 << 20, False), "3 MiB"),
        (Limits(), 1, False, False, None, "died"),
        (Limits(), 1, False, True, None, "did not go idle"),
        (Limits(), 1, True, True, Idle(100, retiring=True), "one-shot"),
    ],
)
def test_an_executor_is_replaced_when_it_must_be(
    limits: Limits, trials: int, one_shot: bool, alive: bool, idle: Idle | None, expected: str
) -> None:
    why = replacement_reason(
        limits, trials=trials, one_shot=one_shot, alive=alive, idle=idle, death="killed"
    )
    assert (expected in why) if expected else why == ""


# ---- background work ---------------------------------------------------------------


def test_endings_run_in_submission_order_off_the_calling_thread() -> None:
    endings = InOrder("test-endings")
    done: list[int] = []
    threads: set[str] = set()
    gate = threading.Event()

    def ending(n: int) -> None:
        gate.wait(5)
        threads.add(threading.current_thread().name)
        done.append(n)

    started = time.monotonic()
    for n in range(5):
        endings.submit(lambda n=n: ending(n))  # type: ignore[misc]
    assert time.monotonic() - started < 1 and endings.pending == 5  # submit never waits
    gate.set()
    assert endings.drain(10)
    assert done == [0, 1, 2, 3, 4] and threads == {"test-endings"}
    endings.close()


def test_checkpoint_uploads_do_not_block_and_the_newest_snapshot_wins(tmp_path: Path) -> None:
    puts: list[tuple[str, str]] = []

    class SlowStore(ArtifactStore):
        def put_dir(self, local: Path, key: str) -> str:
            time.sleep(0.5)
            puts.append((key, (local / "epoch").read_text()))
            return key

    store = SlowStore(str(tmp_path / "store"))
    uploads = Uploads(store, tmp_path / "scratch")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    started = time.monotonic()
    for epoch in range(1, 5):
        # A runner replaces its checkpoint file (a new inode), never rewrites it.
        partial = checkpoint / "epoch.partial"
        partial.write_text(str(epoch))
        partial.replace(checkpoint / "epoch")
        uploads.submit(checkpoint, "checkpoints/s/0")
    assert time.monotonic() - started < 0.5
    assert uploads.drain(10)
    uploads.close()
    # The first upload was under way; the later snapshots collapsed into the newest.
    assert puts[-1] == ("checkpoints/s/0", "4")
    assert len(puts) < 4
    assert not list((tmp_path / "scratch").iterdir())


def test_a_snapshot_taken_while_the_runner_writes_skips_what_moves_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The runner's next epoch goes on while the last epoch's snapshot is
    # taken: its checkpoint half written, and (a user's loop) a scratch
    # directory and a file that are renamed away after the listing.
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "ckpt_temp").mkdir(parents=True)
    (checkpoint / "ckpt_temp" / "shard").write_text("half")
    (checkpoint / "torch-checkpoint.partial").write_text("half")
    (checkpoint / "gone").write_text("old")
    (checkpoint / "torch-checkpoint").write_text("epoch 3")
    real_link = os.link

    def racing_link(source: str, target: str) -> None:
        (checkpoint / "gone").unlink(missing_ok=True)
        shutil.rmtree(checkpoint / "ckpt_temp", ignore_errors=True)
        real_link(source, target)

    monkeypatch.setattr("svc_trainer.background.os.link", racing_link)
    puts: list[set[str]] = []

    class Store(ArtifactStore):
        def put_dir(self, local: Path, key: str) -> str:
            puts.append({str(p.relative_to(local)) for p in local.rglob("*") if p.is_file()})
            return key

    uploads = Uploads(Store(str(tmp_path / "store")), tmp_path / "scratch")
    uploads.submit(checkpoint, "checkpoints/s/0")
    # A runner that has written nothing whole yet: the store keeps what it has.
    uploads.submit(tmp_path / "not-yet", "checkpoints/s/1")
    assert uploads.drain(10)
    uploads.close()
    assert puts == [{"torch-checkpoint"}]
    assert not list((tmp_path / "scratch").iterdir())


def test_one_fold_of_a_cross_validation_is_a_trial_of_its_own(tmp_path: Path) -> None:
    splits = _splits()
    whole = _Recorder()
    evaluation.run(whole, _spec(tmp_path, {"cv_folds": "4"}), splits, _Channel())
    one = _Recorder()
    channel = _Channel()
    result = evaluation.run(
        one, _spec(tmp_path, {"cv_folds": "4", "cv_fold": "2"}), splits, channel
    )

    [(spec, fold_data)] = one.seen
    assert np.array_equal(fold_data.x_test, whole.seen[2][1].x_test)
    assert spec.checkpoint_dir == str(tmp_path / "ckpt" / "fold-2")
    assert channel.steps == [1, 2] and channel.starts == [0]
    assert set(result.test_metrics) == {"test_error", "test_loss", "fold_2_error", "fold_2_loss"}
    with pytest.raises(TrialError, match="cv_fold"):
        evaluation.run(one, _spec(tmp_path, {"cv_folds": "4", "cv_fold": "4"}), splits, _Channel())
    with pytest.raises(TrialError, match="cv_folds"):
        evaluation.run(one, _spec(tmp_path, {"cv_fold": "1"}), splits, _Channel())
