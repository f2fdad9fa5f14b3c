"""svc_trainer as processes on a real broker: trial in, reports and a
model-ready event out, for every strategy of both frameworks; bad trials;
prune; kill -9 and SIGTERM mid-trial."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.artifacts import ArtifactStore, digest, local_path
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import common_pb2, events_pb2, models_pb2, tuning_pb2
from shared.object_store import filesystem
from tests.infra import Infra, read_topic
from tests.integration.trainer_service import (
    Stack,
    model_ready,
    publish,
    trial_request,
)
from tests.object_store import LocalObjectStore

TF = common_pb2.FRAMEWORK_TENSORFLOW
TORCH = common_pb2.FRAMEWORK_TORCH
# Epochs of a second or more on this machine's CPU, so that a test can act
# mid-trial: wide convolutions on digits.
SLOW = {"filters": 96, "kernel_width": 5, "units": 256, "batch_size": 16}


@pytest.fixture(scope="module")
def shared_stack(infra: Infra, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One trainer for the tests that need one and do not disturb it."""
    stack = Stack(infra, tmp_path_factory.mktemp("trainer-state"))
    stack.trainer("shared")
    yield stack
    stack.close()


@pytest.fixture
def stack(infra: Infra, tmp_path: Path) -> Iterator[Stack]:
    created = Stack(infra, tmp_path)
    yield created
    created.close()


@pytest.mark.parametrize(
    ("framework", "strategy", "world_size", "options"),
    [
        (TORCH, "single", 0, {}),
        (TORCH, "ddp", 2, {}),
        (TORCH, "model_parallel", 0, {}),
        (TF, "one_device", 0, {}),
        (TF, "multi_worker_mirrored", 2, {}),
        (TF, "parameter_server", 1, {"ps": "1"}),
    ],
    ids=[
        "torch-single",
        "torch-ddp2",
        "torch-model-parallel",
        "tf-one-device",
        "tf-mwms2",
        "tf-ps",
    ],
)
def test_a_trial_becomes_reports_and_a_served_model(
    shared_stack: Stack, framework: int, strategy: str, world_size: int, options: dict[str, str]
) -> None:
    study = f"strategies-{uuid.uuid4().hex[:8]}"
    request = trial_request(
        study, 3, framework=framework, strategy=strategy, world_size=world_size, options=options
    )
    shared_stack.send(request)

    final = shared_stack.final(request.trial_id)
    assert final.WhichOneof("event") == "completed", (final, shared_stack.logs())
    reports = shared_stack.reports(request.trial_id)
    # Heartbeats from the moment the trial is taken (data loading included).
    kinds = [r.WhichOneof("event") for r in reports if r.WhichOneof("event") != "heartbeat"]
    assert kinds == ["started", "progress", "progress", "completed"]
    assert [r.started.resumed_from_step for r in reports if r.HasField("started")] == [0]
    progress = [r.progress for r in reports if r.WhichOneof("event") == "progress"]
    assert [p.step for p in progress] == [1, 2]
    assert {"loss", "val_error", "val_accuracy", "samples_per_s"} <= set(progress[-1].metrics)
    completed = final.completed
    assert completed.value == pytest.approx(progress[-1].value)
    assert (completed.model_name, completed.model_version) == (study, "4")
    assert completed.metrics["test_accuracy"] > 0.3
    assert all(r.trainer_id == "shared" and r.attempt == 1 for r in reports)

    ready = model_ready(shared_stack.recorder, shared_stack.topics.models, request.trial_id)
    assert (ready.model_name, ready.version) == (study, "4")
    assert ready.framework == framework
    expected_format = (
        models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT
        if framework == TORCH
        else models_pb2.ARTIFACT_FORMAT_TF_SAVED_MODEL
    )
    assert ready.format == expected_format
    sha, size = digest(local_path(ready.artifact_uri))
    assert (ready.sha256, ready.size_bytes) == (sha, size)
    assert [(t.name, t.datatype, list(t.shape)) for t in ready.inputs] == [
        ("input", "FP32", [-1, 8, 8])
    ]
    assert [(t.name, list(t.shape)) for t in ready.outputs] == [("probabilities", [-1, 10])]
    assert ready.metrics["val_error"] == pytest.approx(completed.value)
    assert ready.objective.metric == "val_error"
    assert ready.lineage.trial_id == request.trial_id and ready.lineage.trial_number == 3
    assert ready.lineage.params["filters"].int_value == 8
    assert ready.lineage.data.dataset.startswith("digits@")
    assert ready.labels["strategy"] == strategy
    runs = list((shared_stack.state / "tensorboard" / study).glob("trial-3/events.out.tfevents.*"))
    assert runs, "no TensorBoard run for the trial"


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"dataset": "imagenet"}, "unknown_dataset"),
        ({"model_family": "transformer"}, "unknown_model"),
        ({"strategy": "horovod"}, "unknown_strategy"),
        ({"params": {"dropout": 1.5}}, "invalid_params"),
        ({"params": {"no_such_knob": 3}}, "invalid_params"),
        ({"metric": "val_bleu"}, "unknown_metric"),
        ({"framework": common_pb2.FRAMEWORK_UNSPECIFIED}, "unknown_framework"),
    ],
)
def test_a_trial_that_cannot_be_trained_fails_with_its_reason(
    shared_stack: Stack, overrides: dict[str, object], reason: str
) -> None:
    request = trial_request(f"bad-{uuid.uuid4().hex[:8]}", 0, **overrides)  # type: ignore[arg-type]
    shared_stack.send(request)
    final = shared_stack.final(request.trial_id, timeout=120)
    assert final.WhichOneof("event") == "failed", final
    assert final.failed.reason == reason and not final.failed.retryable
    assert final.failed.message
    assert shared_stack.trainers[0].process.poll() is None  # the worker lives on


def test_an_undecodable_trial_is_dead_lettered_and_the_next_one_trains(
    shared_stack: Stack,
) -> None:
    producer = BusProducer(shared_stack.infra.kafka, source="test")
    producer.publish_raw(shared_stack.topics.trials, b"\xff\x00 not a trial", key=b"junk")
    producer.flush()
    request = trial_request(f"after-junk-{uuid.uuid4().hex[:8]}", 0, epochs=1)
    shared_stack.send(request)

    assert shared_stack.final(request.trial_id).WhichOneof("event") == "completed"
    [letter_bytes] = read_topic(
        shared_stack.infra.kafka, shared_stack.topics.dlq, wanted=1, timeout=30
    )
    letter = events_pb2.DeadLetter.FromString(letter_bytes)
    assert letter.original_value == b"\xff\x00 not a trial"
    assert letter.source.topic == shared_stack.topics.trials and letter.reason


def test_a_prune_message_stops_the_trial_within_one_epoch(shared_stack: Stack) -> None:
    request = trial_request(f"prune-{uuid.uuid4().hex[:8]}", 0, epochs=60, params=SLOW)
    shared_stack.send(request)
    first = shared_stack.recorder.wait_for(
        shared_stack.topics.reports,
        lambda r: r.trial_id == request.trial_id and r.WhichOneof("event") == "progress",
        timeout=180,
    )
    assert isinstance(first, tuning_pb2.TrialReport)
    seen = max(r.progress.step for r in shared_stack.reports(request.trial_id) if r.progress.step)
    control = tuning_pb2.TrialControl(
        trial_id=request.trial_id,
        study_id=request.study_id,
        action=tuning_pb2.CONTROL_ACTION_PRUNE,
        step=seen,
    )
    publish(shared_stack.infra.kafka, shared_stack.topics.control, control)

    final = shared_stack.final(request.trial_id, timeout=120)
    assert final.WhichOneof("event") == "pruned", final
    # Within one epoch of the trainer reading the request (the bus's own
    # latency is not the trainer's to promise: epochs here take about a second).
    [received] = [
        event
        for event in shared_stack.trainers[0].log_events("trial.stop_requested")
        if event["trial_id"] == request.trial_id
    ]
    assert received["reached"] >= seen
    assert final.pruned.step <= received["reached"] + 1
    steps = [r.progress.step for r in shared_stack.reports(request.trial_id) if r.progress.step]
    assert max(steps) <= received["reached"] + 1
    assert not [
        m
        for m in shared_stack.recorder.messages(shared_stack.topics.models)
        if isinstance(m, models_pb2.ModelReady) and m.lineage.trial_id == request.trial_id
    ]


def _progress_by(stack: Stack, trial_id: str, trainer: str) -> list[int]:
    return [
        r.progress.step
        for r in stack.reports(trial_id)
        if r.trainer_id == trainer and r.WhichOneof("event") == "progress"
    ]


def _wait_for_step(stack: Stack, trial_id: str, trainer: str, step: int) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if max(_progress_by(stack, trial_id, trainer), default=0) >= step:
            return
        time.sleep(0.1)
    raise AssertionError(f"{trainer} never reached step {step}:\n{stack.logs()}")


def _uploaded_epoch(store: ArtifactStore, request: tuning_pb2.TrialRequested, scratch: Path) -> int:
    """The epoch of the trial's checkpoint in the remote store (0: none yet)."""
    import torch

    from svc_trainer import trials
    from svc_trainer.backends.torch import loop as torch_loop

    key = f"checkpoints/{trials.trial_key(request)}"
    if not store.get_checkpoint(key, scratch):
        return 0
    saved = torch.load(scratch / torch_loop.CHECKPOINT_FILE, weights_only=True)
    return int(saved["epoch"])


def test_a_killed_trainer_s_trial_resumes_elsewhere_from_its_checkpoint_on_the_bucket(
    stack: Stack, object_store: LocalObjectStore, tmp_path: Path
) -> None:
    """The trainers share nothing but the bucket: each has its own state
    directory, their artifact store and TensorBoard runs are on the object
    store, so the second resumes from what the first uploaded."""
    prefix = uuid.uuid4().hex[:8]
    root = object_store.url(f"{prefix}/artifacts")
    store = ArtifactStore(root, object_store.settings)
    env = {
        "AISTACK_TRAINER_ARTIFACT_ROOT": root,
        "AISTACK_TRAINER_TENSORBOARD_DIR": object_store.url(f"{prefix}/tensorboard"),
        **object_store.env(),
    }
    first = stack.trainer("first", {**env, "AISTACK_STATE_DIR": str(tmp_path / "first")})
    request = trial_request(f"kill-{uuid.uuid4().hex[:8]}", 0, epochs=6, params=SLOW)
    stack.send(request)
    _wait_for_step(stack, request.trial_id, "first", 2)
    # Uploads run behind the reports: wait for the second epoch's.
    deadline = time.monotonic() + 120
    while (uploaded := _uploaded_epoch(store, request, tmp_path / "peek")) < 2:
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.2)
    first.kill()  # kill -9: no hand-back, no commit, no more uploads

    stack.trainer("second", {**env, "AISTACK_STATE_DIR": str(tmp_path / "second")})
    final = stack.final(request.trial_id, timeout=300)
    assert final.WhichOneof("event") == "completed", stack.logs()
    assert final.trainer_id == "second"
    [resumed] = [
        r.started
        for r in stack.reports(request.trial_id)
        if r.trainer_id == "second" and r.WhichOneof("event") == "started"
    ]
    # At least the epoch uploaded before the kill (a later one may have made it).
    assert resumed.resumed_from_step >= uploaded >= 2
    assert _progress_by(stack, request.trial_id, "second") == list(
        range(resumed.resumed_from_step + 1, 7)
    )
    ready = model_ready(stack.recorder, stack.topics.models, request.trial_id)
    assert ready.artifact_uri.startswith(root)
    # The model on the bucket is the one the event's digest names.
    assert ready.artifact_uri.startswith(f"{root}/models/")
    model = tmp_path / "model"
    assert store.get_dir(ready.artifact_uri.removeprefix(f"{root}/"), model)
    assert digest(model)[0] == ready.sha256
    # Each trainer's run of the trial, mirrored to the bucket.
    fs, path = filesystem(object_store.url(f"{prefix}/tensorboard"), object_store.settings)
    runs = [p for p in fs.find(path) if "/events.out.tfevents." in p]
    assert len(runs) == 2, runs


def test_sigterm_hands_the_trial_back_and_exits_cleanly(stack: Stack) -> None:
    first = stack.trainer("first")
    request = trial_request(f"term-{uuid.uuid4().hex[:8]}", 0, epochs=6, params=SLOW)
    stack.send(request)
    _wait_for_step(stack, request.trial_id, "first", 1)

    assert first.terminate() == 0
    assert not [
        r
        for r in stack.reports(request.trial_id)
        if r.WhichOneof("event") in ("completed", "failed", "pruned")
    ]
    handed_back_at = max(_progress_by(stack, request.trial_id, "first"))
    stack.trainer("second")
    final = stack.final(request.trial_id, timeout=300)
    assert final.WhichOneof("event") == "completed" and final.trainer_id == "second"
    [resumed] = [
        r.started
        for r in stack.reports(request.trial_id)
        if r.trainer_id == "second" and r.WhichOneof("event") == "started"
    ]
    assert resumed.resumed_from_step == handed_back_at


def test_a_features_trial_forecasts_from_the_offline_store(
    shared_stack: Stack, tmp_path: Path
) -> None:
    from tests.unit.test_trainer_data import series, write_store

    store = tmp_path / "features" / "windows"
    write_store(store, series("sensor-1", 40) + series("sensor-2", 40))
    request = trial_request(
        f"forecast-{uuid.uuid4().hex[:8]}",
        0,
        dataset="features",
        model_family="mlp",
        metric="val_mae",
        epochs=3,
        params={"units": 16},
        options={"path": str(store)},
    )
    shared_stack.send(request)

    final = shared_stack.final(request.trial_id)
    assert final.WhichOneof("event") == "completed", (final, shared_stack.logs())
    assert {"test_mae", "test_rmse"} <= set(final.completed.metrics)
    ready = model_ready(shared_stack.recorder, shared_stack.topics.models, request.trial_id)
    assert [(t.name, list(t.shape)) for t in ready.inputs] == [("input", [-1, 21])]
    assert [(t.name, list(t.shape)) for t in ready.outputs] == [("prediction", [-1, 1])]
    assert ready.lineage.data.dataset.startswith("features@")
    assert ready.labels["dataset_source"] == str(store)
