"""Shared pieces of the trainer tests: digits splits built straight from
scikit-learn, a channel that records what a runner says, and run specs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from svc_trainer.plan import (
    TASK_CLASSIFICATION,
    TASK_REGRESSION,
    DataSplits,
    Hyperparams,
    RunSpec,
    StopReason,
)

SMALL = Hyperparams(filters=8, units=32, batch_size=64, learning_rate=3e-3)


def digits_splits(limit: int | None = None, *, held_out: float = 0.4) -> DataSplits:
    """Stratified: ``held_out`` of the rows split evenly into validation and
    test (0.4: svc_trainer.data.datasets's 60/20/20), the rest for training."""
    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    x_train, x_rest, y_train, y_rest = train_test_split(
        x, y, test_size=held_out, stratify=y, random_state=0
    )
    x_val, x_test, y_val, y_test = train_test_split(
        x_rest, y_rest, test_size=0.5, stratify=y_rest, random_state=0
    )
    if limit is not None:
        x_train, y_train = x_train[:limit], y_train[:limit]
    return DataSplits(
        name="digits",
        version="test",
        task=TASK_CLASSIFICATION,
        x_train=x_train,
        y_train=y_train,
        x_val=x_val,
        y_val=y_val,
        x_test=x_test,
        y_test=y_test,
        n_classes=10,
    )


def regression_splits(rows: int = 600, features: int = 6) -> DataSplits:
    """y = a linear function of raw features on very different scales, plus noise."""
    rng = np.random.default_rng(3)
    scale = np.array([1, 10, 100, 0.1, 5, 50][:features], dtype=np.float32)
    x = (rng.normal(size=(rows, features)) * scale + 20).astype(np.float32)
    y = (x @ (1 / scale) + rng.normal(scale=0.05, size=rows)).astype(np.float32)
    a, b = int(rows * 0.7), int(rows * 0.85)
    return DataSplits(
        name="synthetic",
        version="test",
        task=TASK_REGRESSION,
        x_train=x[:a],
        y_train=y[:a],
        x_val=x[a:b],
        y_val=y[a:b],
        x_test=x[b:],
        y_test=y[b:],
    )


def run_spec(tmp: Path, **overrides: Any) -> RunSpec:
    values: dict[str, Any] = {
        "trial_id": "study/0",
        "study_id": "study",
        "trial_number": 0,
        "attempt": 1,
        "dataset": "digits",
        "model_family": "cnn",
        "framework": "torch",
        "strategy": "single",
        "world_size": 0,
        "epochs": 2,
        "hparams": SMALL,
        "seed": 5,
        "objective_metric": "val_error",
        "checkpoint_dir": str(tmp / "checkpoints"),
        "export_dir": str(tmp / "export"),
        "tensorboard_dir": str(tmp / "tensorboard"),
        "device": "cpu",
    }
    values.update(overrides)
    return RunSpec(**values)


@dataclass(kw_only=True)
class RecordingChannel:
    """Records started/epoch calls; after ``stop_after`` epochs it asks to
    stop. Picklable, for runs in a fresh process."""

    stop_after: int | None = None
    reason: StopReason = StopReason.PRUNE
    events: list[tuple[str, Any, Any]] = field(default_factory=list)

    def started(self, resumed_from_step: int, note: str = "") -> None:
        self.events.append(("started", resumed_from_step, note))

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        self.events.append(("epoch", step, dict(metrics)))

    def stop_requested(self) -> StopReason:
        if self.stop_after is not None and len(self.epochs()) >= self.stop_after:
            return self.reason
        return StopReason.NONE

    def epochs(self) -> list[tuple[int, dict[str, float]]]:
        return [(step, metrics) for kind, step, metrics in self.events if kind == "epoch"]

    def started_events(self) -> list[tuple[int, str]]:
        return [(step, note) for kind, step, note in self.events if kind == "started"]
