"""The tuner's report handler on the in-memory bus and Optuna's in-memory
storage: no broker, no Redis."""

from __future__ import annotations

import pytest

from shared.bus.loop import ConsumeLoop, DeadLetters
from shared.bus.testing import MemoryPublisher, MemorySource, record
from shared.contracts.aistack.v1 import tuning_pb2

optuna = pytest.importorskip("optuna")

from aistack.studies import load_spec  # noqa: E402
from svc_tuner.dispatch import PartitionSlots  # noqa: E402
from svc_tuner.engine import Engine, Outcome  # noqa: E402
from svc_tuner.handlers import UNKNOWN_TRIAL, ReportHandler  # noqa: E402

SPEC = """
name: handler-test
objective: {metric: loss, direction: DIRECTION_MINIMIZE}
params:
  - {name: x, float_range: {low: -4.0, high: 4.0}}
sampler: {kind: SAMPLER_KIND_RANDOM}
budget: {max_trials: 3, max_parallel: 1, trial_timeout: 60s, max_attempts: 2}
task: {dataset: analytic, framework: FRAMEWORK_TORCH, epochs: 1}
seed: 3
"""
DLQ = "dlq"
Report = tuning_pb2.TrialReport


def test_a_completed_trial_makes_room_for_the_next_and_a_stray_report_is_dead_lettered() -> None:
    engine = Engine(optuna.storages.InMemoryStorage())
    study_id, _ = engine.create_study(load_spec(SPEC))
    [first] = engine.ask(study_id).requests
    engine.mark_published(first)
    published: list[Outcome] = []
    slots = PartitionSlots(2)
    slots.place(first.trial_id)
    handler = ReportHandler(engine, slots, published.append)
    done = Report(
        trial_id=first.trial_id,
        study_id=study_id,
        attempt=first.attempt,
        completed=tuning_pb2.TrialCompleted(value=1.5),
    )
    stray = Report(
        trial_id="no-such-study/3", study_id="no-such-study", attempt=1,
        heartbeat=tuning_pb2.TrialHeartbeat(step=1),
    )  # fmt: skip
    source: MemorySource[Report] = MemorySource(
        [record(Report, stray, offset=0), record(Report, done, offset=1)]
    )
    publisher = MemoryPublisher()
    loop = ConsumeLoop(
        source,
        handler,
        publisher=publisher,
        dead_letters=DeadLetters(publisher, topic=DLQ, service="svc_tuner"),
    )

    loop.step()

    [letter] = publisher.dead_letters(DLQ)
    assert letter.reason == UNKNOWN_TRIAL
    assert Report.FromString(letter.original_value) == stray
    [outcome] = published
    [second] = outcome.requests
    assert second.trial_number == first.trial_number + 1
    # The freed partition goes to the request that took the slot.
    assert slots.place(second.trial_id) == 0
    assert [r.offset for r in source.committed] == [0, 1]


def test_drift_events_start_one_retune_and_its_first_trials_are_asked() -> None:
    from shared.contracts.aistack.v1 import models_pb2, monitoring_pb2
    from shared.contracts.aistack.v1 import tuner_service_pb2 as api
    from svc_tuner.handlers import DriftHandler

    engine = Engine(optuna.storages.InMemoryStorage())
    spec = load_spec(SPEC + "retune: {on_drift: true, max_trials: 2}\n")
    study_id, _ = engine.create_study(spec)
    while engine.state(study_id) == api.STUDY_STATE_RUNNING:
        for request in engine.ask(study_id).requests:
            engine.mark_published(request)
            done = tuning_pb2.TrialCompleted(value=float(request.trial_number))
            engine.apply(
                Report(trial_id=request.trial_id, study_id=study_id, attempt=1, completed=done)
            )
    Drift = monitoring_pb2.DriftDetected
    serving = models_pb2.ModelReady(model_name="m", version="3")
    drift = Drift(drift_id="d", model_name="m", study_id=study_id, serving=serving)
    other = Drift(drift_id="e", model_name="m", study_id="not-tuned-here")
    source: MemorySource[monitoring_pb2.DriftDetected] = MemorySource(
        [record(Drift, m, offset=i) for i, m in enumerate((drift, drift, other))]
    )
    published: list[Outcome] = []
    publisher = MemoryPublisher()
    loop = ConsumeLoop(
        source,
        DriftHandler(engine, published.append),
        publisher=publisher,
        dead_letters=DeadLetters(publisher, topic=DLQ, service="svc_tuner"),
    )

    loop.step()

    [outcome] = published
    # The re-tune's first trial: the study's best (trial 0, value 0.0).
    [first] = outcome.requests
    assert first.study_id == f"{study_id}-retune-1" and first.task.baseline.version == "3"
    best = engine.trial(study_id, 0).params
    assert {k: v.float_value for k, v in first.params.items()} == best
    assert sorted(engine.study_ids()) == [study_id, f"{study_id}-retune-1"]
    assert publisher.dead_letters(DLQ) == []
    assert [r.offset for r in source.committed] == [0, 1, 2]
