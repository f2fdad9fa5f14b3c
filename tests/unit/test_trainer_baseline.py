"""A trial's baseline: scored as the runners score, on the trial's own
validation split, and a trial error for a baseline that cannot be had."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format
from numpy.typing import NDArray

from shared.artifacts import digest
from shared.contracts.aistack.v1 import models_pb2
from shared.model_loading import Runner, TensorSig
from svc_trainer import baseline
from svc_trainer.plan import (
    TASK_CLASSIFICATION,
    TASK_REGRESSION,
    DataSplits,
    Hyperparams,
    RunSpec,
    TrialError,
)


def model(
    run: Callable[[Mapping[str, NDArray[Any]]], dict[str, NDArray[Any]]],
    *,
    width: int = 3,
    inputs: int = 1,
    output: str = "prediction",
) -> Runner:
    return Runner(
        inputs=tuple(TensorSig(f"input{i or ''}", "FP32", (-1, width)) for i in range(inputs)),
        outputs=(TensorSig(output, "FP32", (-1, 1)),),
        run=run,
        platform="test",
    )


def row_sums(arrays: Mapping[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
    return {"prediction": arrays["input"].sum(axis=1, keepdims=True)}


def splits(x_val: NDArray[Any], y_val: NDArray[Any], task: str = TASK_REGRESSION) -> DataSplits:
    empty = np.empty((0, *x_val.shape[1:]), dtype=np.float32)
    return DataSplits(
        name="test",
        version="v",
        task=task,
        x_train=empty,
        y_train=y_val[:0],
        x_val=x_val,
        y_val=y_val,
        x_test=empty,
        y_test=y_val[:0],
        n_classes=2 if task == TASK_CLASSIFICATION else 0,
    )


def test_regression_scores_are_the_runners_metrics() -> None:
    got = baseline.scores(np.array([[1.0], [2.0], [4.0]]), np.array([1.0, 1.0, 1.0]), "regression")
    # Errors 0, 1, 3.
    assert got == pytest.approx(
        {"val_mae": 4 / 3, "val_mse": 10 / 3, "val_rmse": math.sqrt(10 / 3), "val_loss": 10 / 3}
    )


def test_classification_scores_are_the_runners_metrics() -> None:
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    got = baseline.scores(probabilities, np.array([0, 1, 1]), TASK_CLASSIFICATION)
    # The runners' cross-entropy of the logits: -log of the label's probability.
    loss = -(math.log(0.9) + math.log(0.8) + math.log(0.4)) / 3
    assert got == pytest.approx(
        {"val_accuracy": 2 / 3, "val_error": 1 / 3, "val_loss": loss}, rel=1e-12
    )
    # A confident miss costs much, but not infinity.
    certain = baseline.scores(np.array([[1.0, 0.0]]), np.array([1]), TASK_CLASSIFICATION)
    assert math.isfinite(certain["val_loss"]) and certain["val_loss"] > 600


def test_the_baseline_is_measured_on_the_validation_split_in_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(baseline, "CHUNK_ROWS", 2)
    calls: list[int] = []

    def run(arrays: Mapping[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
        calls.append(len(arrays["input"]))
        assert arrays["input"].dtype == np.float32
        return row_sums(arrays)

    x = np.arange(15, dtype=np.float64).reshape(5, 3)
    y = x.sum(axis=1) + np.array([0.0, 1.0, -1.0, 2.0, 0.0])
    got = baseline.measure(model(run), splits(x, y), "val_mae", named="baseline m version 2")
    assert got == {"baseline_val_mae": pytest.approx(4 / 5)}
    assert calls == [2, 2, 1]


@pytest.mark.parametrize(
    ("runner", "metric", "message"),
    [
        (model(row_sums, width=4), "val_mae", "is [-1, 4] but the trial's examples are [3]"),
        (model(row_sums, inputs=2), "val_mae", "takes 2 inputs"),
        (model(row_sums), "val_accuracy", "a regression model has no 'val_accuracy'"),
        (model(lambda a: {"prediction": np.zeros((4, 2))}), "val_mae", "gives 8 values for 4"),
        (model(lambda a: {"nope": a["input"]}), "val_mae", "fails on the validation split"),
    ],
)
def test_a_baseline_that_cannot_score_this_data_fails_the_trial(
    runner: Runner, metric: str, message: str
) -> None:
    data = splits(np.ones((4, 3), dtype=np.float32), np.ones(4, dtype=np.float32))
    with pytest.raises(TrialError) as caught:
        baseline.measure(runner, data, metric, named="baseline forecast version 3")
    assert caught.value.reason == "bad_baseline"
    assert caught.value.message.startswith("baseline forecast version 3: ")
    assert message in caught.value.message


def test_a_classifier_baseline_needs_a_probability_per_label() -> None:
    def two_classes(arrays: Mapping[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
        return {"probabilities": np.full((len(arrays["input"]), 2), 0.5)}

    data = splits(np.ones((3, 3), dtype=np.float32), np.array([0, 1, 2]), TASK_CLASSIFICATION)
    with pytest.raises(TrialError) as caught:
        baseline.measure(model(two_classes, output="probabilities"), data, "val_error", named="b")
    assert caught.value.reason == "bad_baseline"
    assert "2 probabilities but the labels go up to 2" in caught.value.message
    fine = splits(np.ones((2, 3), dtype=np.float32), np.array([0, 1]), TASK_CLASSIFICATION)
    got = baseline.measure(model(two_classes, output="probabilities"), fine, "val_error", named="b")
    assert got == {"baseline_val_error": 0.5}


def spec(tmp_path: Path, event: models_pb2.ModelReady | None) -> RunSpec:
    return RunSpec(
        trial_id="s/0",
        study_id="s",
        trial_number=0,
        attempt=1,
        dataset="features",
        model_family="mlp",
        framework="torch",
        strategy="single",
        world_size=0,
        epochs=1,
        hparams=Hyperparams(),
        seed=0,
        objective_metric="val_mae",
        checkpoint_dir=str(tmp_path / "c"),
        export_dir=str(tmp_path / "e"),
        tensorboard_dir=str(tmp_path / "t"),
        baseline=json_format.MessageToJson(event, indent=None) if event else "",
        baseline_dir=str(tmp_path / "baselines"),
    )


def event(artifact: Path, sha256: str) -> models_pb2.ModelReady:
    return models_pb2.ModelReady(
        model_name="forecast",
        version="3",
        format=models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT,
        artifact_uri=str(artifact),
        sha256=sha256,
        inputs=[models_pb2.TensorSpec(name="input", datatype="FP32", shape=[-1, 3])],
        outputs=[models_pb2.TensorSpec(name="prediction", datatype="FP32", shape=[-1, 1])],
    )


def test_no_baseline_measures_nothing(tmp_path: Path) -> None:
    data = splits(np.ones((2, 3), dtype=np.float32), np.ones(2, dtype=np.float32))
    assert baseline.evaluate(spec(tmp_path, None), data) == {}


def test_a_missing_or_altered_artifact_fails_the_trial_naming_the_version(tmp_path: Path) -> None:
    artifact = tmp_path / "models" / "forecast" / "3"
    artifact.mkdir(parents=True)
    (artifact / "model.pt2").write_bytes(b"weights")
    data = splits(np.ones((2, 3), dtype=np.float32), np.ones(2, dtype=np.float32))
    cases = [
        (event(tmp_path / "nowhere", digest(artifact)[0]), "(artifact_missing)"),
        (event(artifact, "0" * 64), "(checksum_mismatch)"),
        # The right bytes, but not a program torch can load.
        (event(artifact, digest(artifact)[0]), "(unloadable)"),
    ]
    for bad, problem in cases:
        with pytest.raises(TrialError) as caught:
            baseline.evaluate(spec(tmp_path, bad), data)
        assert caught.value.reason == "bad_baseline"
        assert caught.value.message.startswith("baseline forecast version 3 cannot be loaded")
        assert problem in caught.value.message
