"""svc_trainer's warm executors on a real broker: trials reuse one process
(proved by its pid), a trial that kills its executor fails with the reason
and the next trial runs, prune and SIGTERM reach a warm run, and nothing
outlives the trainer."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.contracts.aistack.v1 import models_pb2, tuning_pb2
from tests.infra import Infra
from tests.integration.trainer_service import (
    Stack,
    TrainerProcess,
    model_ready,
    publish,
    trial_request,
)

FAULTY = {
    "AISTACK_TRAINER_RUNNERS": '{"faulty": "tests.integration.faulty_runner:RUNNER"}',
    "AISTACK_TRAINER_EXECUTOR_STALL_SECONDS": "5",
}
SLOW = {"filters": 96, "kernel_width": 5, "units": 256, "batch_size": 16}


@pytest.fixture(scope="module")
def warm(infra: Infra, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(infra, tmp_path_factory.mktemp("warm-trainer"))
    stack.trainer("warm", FAULTY)
    yield stack
    stack.close()


def _started(trainer: TrainerProcess, trial_id: str) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [e for e in trainer.log_events("trial.started") if e["trial_id"] == trial_id]
        if found:
            return found[-1]
        time.sleep(0.2)
    raise AssertionError(f"no trial.started for {trial_id}:\n{trainer.log_text()[-3000:]}")


def _faulty(study: str, fault: str) -> tuning_pb2.TrialRequested:
    return trial_request(study, 0, params={"framework": "faulty"}, options={"fault": fault})


def test_the_second_trial_runs_in_the_first_trials_process(warm: Stack) -> None:
    trainer = warm.trainers[0]
    first = trial_request(f"reuse-{uuid.uuid4().hex[:8]}", 0, epochs=1)
    second = trial_request(f"reuse-{uuid.uuid4().hex[:8]}", 1, epochs=1)
    warm.send(first, second)
    assert warm.final(first.trial_id).WhichOneof("event") == "completed", warm.logs()
    assert warm.final(second.trial_id).WhichOneof("event") == "completed", warm.logs()

    # In either order: the two requests may sit on different partitions.
    one, two = sorted(
        (_started(trainer, first.trial_id), _started(trainer, second.trial_id)),
        key=lambda started: int(str(started["executor_trials_before"])),
    )
    assert one["executor_pid"] == two["executor_pid"] != trainer.process.pid
    assert two["executor_trials_before"] == int(str(one["executor_trials_before"])) + 1
    assert two["data_cached"] is True


@pytest.mark.parametrize(
    ("fault", "how"),
    [
        ("exit", "exited with code 3"),
        ("segfault", "SIGSEGV"),
        ("oom_kill", "SIGKILL"),
        ("hang", "made no progress"),
    ],
)
def test_a_trial_that_kills_its_executor_fails_and_the_next_trial_runs(
    warm: Stack, fault: str, how: str
) -> None:
    trainer = warm.trainers[0]
    killer = _faulty(f"{fault}-{uuid.uuid4().hex[:8]}", fault)
    warm.send(killer)
    final = warm.final(killer.trial_id, timeout=120)
    assert final.WhichOneof("event") == "failed", final
    reason = "executor_stalled" if fault == "hang" else "executor_died"
    assert final.failed.reason == reason and final.failed.retryable
    assert how in final.failed.message, final.failed.message
    dead_pid = int(final.failed.message.split("(pid ")[1].split(")")[0])

    # A new executor for the framework; the worker never went down.
    after = _faulty(f"after-{fault}-{uuid.uuid4().hex[:8]}", "refuse")
    warm.send(after)
    final = warm.final(after.trial_id, timeout=120)
    assert final.WhichOneof("event") == "failed" and final.failed.reason == "invalid_params"
    assert not final.failed.retryable
    assert f"pid {dead_pid}" not in final.failed.message
    torch_trial = trial_request(f"then-{uuid.uuid4().hex[:8]}", 0, epochs=1)
    warm.send(torch_trial)
    assert warm.final(torch_trial.trial_id).WhichOneof("event") == "completed", warm.logs()
    assert trainer.process.poll() is None


def test_a_prune_stops_a_warm_run_and_the_executor_trains_the_next_trial(warm: Stack) -> None:
    trainer = warm.trainers[0]
    slow = trial_request(f"prune-warm-{uuid.uuid4().hex[:8]}", 0, epochs=60, params=SLOW)
    warm.send(slow)
    warm.recorder.wait_for(
        warm.topics.reports,
        lambda r: r.trial_id == slow.trial_id and r.WhichOneof("event") == "progress",
        timeout=180,
    )
    seen = max(r.progress.step for r in warm.reports(slow.trial_id) if r.progress.step)
    publish(
        warm.infra.kafka,
        warm.topics.control,
        tuning_pb2.TrialControl(
            trial_id=slow.trial_id,
            study_id=slow.study_id,
            action=tuning_pb2.CONTROL_ACTION_PRUNE,
            step=seen,
        ),
    )
    final = warm.final(slow.trial_id, timeout=120)
    # The prune reaches the run at an epoch's end: the one under way when it
    # was sent, or, when the worker polls it a moment after that epoch
    # ended (a loaded machine), the next.
    assert final.WhichOneof("event") == "pruned" and final.pruned.step <= seen + 2

    after = trial_request(f"after-prune-{uuid.uuid4().hex[:8]}", 0, epochs=1)
    warm.send(after)
    assert warm.final(after.trial_id).WhichOneof("event") == "completed", warm.logs()
    assert (
        _started(trainer, after.trial_id)["executor_pid"]
        == _started(trainer, slow.trial_id)["executor_pid"]
    )


def test_sigterm_during_a_warm_run_hands_back_and_leaves_no_process(
    infra: Infra, tmp_path: Path
) -> None:
    stack = Stack(infra, tmp_path)
    try:
        trainer = stack.trainer("term")
        warmup = trial_request(f"term-warm-{uuid.uuid4().hex[:8]}", 0, epochs=1)
        slow = trial_request(f"term-slow-{uuid.uuid4().hex[:8]}", 1, epochs=60, params=SLOW)
        stack.send(warmup)
        assert stack.final(warmup.trial_id).WhichOneof("event") == "completed", stack.logs()
        stack.send(slow)
        stack.recorder.wait_for(
            stack.topics.reports,
            lambda r: r.trial_id == slow.trial_id and r.WhichOneof("event") == "progress",
            timeout=180,
        )
        pid = int(str(_started(trainer, slow.trial_id)["executor_pid"]))

        assert trainer.terminate() == 0
        assert not [
            r
            for r in stack.reports(slow.trial_id)
            if r.WhichOneof("event") in ("completed", "failed", "pruned")
        ]
        assert trainer.log_events("trial.handed_back")
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        stack.close()


def test_a_refit_trains_on_training_and_validation_data(warm: Stack) -> None:
    from svc_trainer.data.datasets import load

    splits = load("digits", {}, seed=0)
    plain = trial_request(f"plain-{uuid.uuid4().hex[:8]}", 0, epochs=1)
    refit = trial_request(f"refit-{uuid.uuid4().hex[:8]}", 0, epochs=1, options={"refit": "true"})
    warm.send(plain, refit)
    for request in (plain, refit):
        assert warm.final(request.trial_id).WhichOneof("event") == "completed", warm.logs()

    plain_ready = model_ready(warm.recorder, warm.topics.models, plain.trial_id)
    refit_ready = model_ready(warm.recorder, warm.topics.models, refit.trial_id)
    assert plain_ready.labels["train_examples"] == str(len(splits.y_train))
    assert refit_ready.labels["train_examples"] == str(len(splits.y_train) + len(splits.y_val))
    assert refit_ready.labels["refit"] == "true"
    assert 0 <= refit_ready.metrics["test_error"] < 0.9  # scored on the untouched test split


def test_a_cross_validation_trial_scores_every_fold_and_exports_nothing(warm: Stack) -> None:
    request = trial_request(f"cv-{uuid.uuid4().hex[:8]}", 0, epochs=1, options={"cv_folds": "3"})
    warm.send(request)
    final = warm.final(request.trial_id)
    assert final.WhichOneof("event") == "completed", warm.logs()
    metrics = final.completed.metrics
    folds = [metrics[f"fold_{i}_error"] for i in range(3)]
    assert metrics["test_error"] == pytest.approx(sum(folds) / 3)
    assert final.completed.value == pytest.approx(metrics["val_error"])
    assert not final.completed.model_name
    steps = [r.progress.step for r in warm.reports(request.trial_id) if r.progress.step]
    assert steps == [1, 2, 3]
    time.sleep(2)  # a model-ready event would have come before the final report
    assert not [
        m
        for m in warm.recorder.messages(warm.topics.models)
        if isinstance(m, models_pb2.ModelReady) and m.lineage.trial_id == request.trial_id
    ]
