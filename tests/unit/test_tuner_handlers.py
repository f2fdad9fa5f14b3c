"""The tuner's report handler on the in-memory bus and Optuna's in-memory
storage: no broker, no Redis."""

from __future__ import annotations

import pytest

from shared.bus.loop import ConsumeLoop, DeadLetters
from shared.bus.testing import MemoryPublisher, MemorySource, record
from shared.contracts.aistack.v1 import tuning_pb2

optuna = pytest.importorskip("optuna")

from compose.study import load_spec  # noqa: E402
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
