"""svc_trainer measures a re-tune's trial against a baseline model on a real
broker: the trial's own validation split, the baseline's value among its
metrics and the version in its labels, the training distribution with the
model; a baseline whose bytes do not match its event fails the trial."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format

from shared import model_loading
from shared.contracts.aistack.v1 import models_pb2, tuning_pb2
from shared.objective import BASELINE_VERSION
from svc_trainer.data.datasets import load
from tests.infra import Infra
from tests.integration.trainer_service import Stack, model_ready, trial_request
from tests.unit.test_trainer_data import series, write_store


@pytest.fixture(scope="module")
def stack(infra: Infra, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    started = Stack(infra, tmp_path_factory.mktemp("trainer-baseline"))
    started.trainer("baseline")
    yield started
    started.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("features") / "windows"
    write_store(root, series("sensor-1", 40) + series("sensor-2", 40))
    return root


def forecast(
    study: str, number: int, options: dict[str, str], baseline: models_pb2.ModelReady | None
) -> tuning_pb2.TrialRequested:
    request = trial_request(
        study,
        number,
        dataset="features",
        model_family="mlp",
        metric="val_mae",
        epochs=2,
        params={"units": 16},
        options=options,
    )
    if baseline is not None:
        request.task.baseline.CopyFrom(baseline)
    return request


def completed(stack: Stack, request: tuning_pb2.TrialRequested) -> tuning_pb2.TrialCompleted:
    stack.send(request)
    final = stack.final(request.trial_id)
    assert final.WhichOneof("event") == "completed", (final, stack.logs())
    return final.completed


def test_a_trial_reports_its_baselines_value_on_its_own_validation_split(
    stack: Stack, store: Path, tmp_path: Path
) -> None:
    study = f"retune-{uuid.uuid4().hex[:8]}"
    options = {"path": str(store), "lags": "1"}
    completed(stack, forecast(study, 0, options, None))
    serving = model_ready(stack.recorder, stack.topics.models, f"{study}/0")
    assert BASELINE_VERSION not in serving.labels
    assert "baseline_val_mae" not in serving.metrics

    # The re-tune reads the later windows only, and measures the serving version there.
    fresh = {**options, "window_from": "2026-11-23T00:10:00Z"}
    request = forecast(study, 1, fresh, serving)
    report = completed(stack, request)
    ready = model_ready(stack.recorder, stack.topics.models, request.trial_id)

    data = load("features", fresh)
    directory = model_loading.fetch(serving, tmp_path / "cache")
    runner = model_loading.load(serving, directory)
    predicted = runner.run({"input": data.x_val})["prediction"].reshape(-1)
    expected = float(np.mean(np.abs(predicted.astype(np.float64) - data.y_val)))
    assert report.metrics["baseline_val_mae"] == pytest.approx(expected, rel=1e-5)
    assert ready.metrics["baseline_val_mae"] == report.metrics["baseline_val_mae"]
    assert ready.labels[BASELINE_VERSION] == serving.version == "1"
    # Its own value is on the same split, so the two compare.
    assert report.value == ready.metrics["val_mae"] != report.metrics["baseline_val_mae"]

    # The distribution of the windows it trained on travels with the model.
    assert ready.training_distribution == json_format.Parse(
        data.distribution, models_pb2.TrainingDistribution()
    )
    assert ready.training_distribution.feature == "temperature@tumbling-60s"
    assert ready.training_distribution.statistics[0].windows == len(data.y_train)
    assert serving.training_distribution.statistics[0].windows > len(data.y_train)


def test_a_baseline_whose_bytes_do_not_match_fails_the_trial(stack: Stack, store: Path) -> None:
    study = f"retune-bad-{uuid.uuid4().hex[:8]}"
    options = {"path": str(store), "lags": "1"}
    completed(stack, forecast(study, 0, options, None))
    serving = model_ready(stack.recorder, stack.topics.models, f"{study}/0")
    altered = models_pb2.ModelReady()
    altered.CopyFrom(serving)
    altered.sha256 = "0" * 64

    request = forecast(study, 1, options, altered)
    stack.send(request)
    final = stack.final(request.trial_id)
    assert final.WhichOneof("event") == "failed", (final, stack.logs())
    assert (final.failed.reason, final.failed.retryable) == ("bad_baseline", False)
    assert f"baseline {study} version 1" in final.failed.message
    assert "checksum_mismatch" in final.failed.message
    assert not [
        m
        for m in stack.recorder.messages(stack.topics.models)
        if m.lineage.trial_id == request.trial_id  # type: ignore[attr-defined]
    ]
