"""The tuning engine's contract: budget and parallelism, idempotent reports,
pruning, lost and poisonous trials, restart, refit, grid; on every storage it
can run on (Optuna's ``testing/storages.py`` pattern). Here Optuna's
in-memory and journal-file storages; tests/integration/test_tuner_engine.py
runs the same tests on the journal in a real Redis, the service's storage."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import BaseStorage, InMemoryStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend

from aistack.studies import load_spec
from shared import search_space
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1 import tuning_pb2
from shared.errors import AlreadyExists, NotFound
from svc_tuner.engine import Engine, Outcome
from svc_tuner.record import details, trial_state

QUADRATIC = """
name: quadratic-{unique}
objective: {{metric: loss, direction: DIRECTION_MINIMIZE}}
params:
  - {{name: x, float_range: {{low: -4.0, high: 4.0}}}}
  - {{name: y, int_range: {{low: -3, high: 3}}}}
sampler: {{kind: SAMPLER_KIND_TPE, startup_trials: 3}}
pruner: {{kind: PRUNER_KIND_MEDIAN, startup_trials: 2}}
budget: {{max_trials: 10, max_parallel: 3, trial_timeout: 60s, max_attempts: 2}}
task: {{dataset: analytic, framework: FRAMEWORK_TORCH, epochs: 3}}
seed: 11
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def quadratic(request: tuning_pb2.TrialRequested) -> float:
    x = search_space.python_value(request.params["x"])
    y = search_space.python_value(request.params["y"])
    assert isinstance(x, float) and isinstance(y, int)
    return (x - 1.0) ** 2 + (y + 2) ** 2


def report(request: tuning_pb2.TrialRequested, **event: Any) -> tuning_pb2.TrialReport:
    return tuning_pb2.TrialReport(
        trial_id=request.trial_id,
        study_id=request.study_id,
        attempt=request.attempt,
        trainer_id="test",
        **event,
    )


def completed(request: tuning_pb2.TrialRequested, value: float) -> tuning_pb2.TrialReport:
    return report(request, completed=tuning_pb2.TrialCompleted(value=value))


@dataclass(frozen=True)
class Backend:
    """A storage the engine runs on. ``open`` connects anew to the same data,
    as a restarted tuner does (in memory: the same object, the process lives on)."""

    name: str
    open: Callable[[], BaseStorage]


def memory_backend() -> Backend:
    storage = InMemoryStorage()
    return Backend("memory", lambda: storage)


def journal_file_backend(path: Path) -> Backend:
    return Backend("journal-file", lambda: JournalStorage(JournalFileBackend(str(path))))


@pytest.fixture(params=["memory", "journal-file"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "memory":
        yield memory_backend()
    else:
        yield journal_file_backend(tmp_path / "journal.log")


@pytest.fixture
def engine(backend: Backend, unique: str) -> tuple[Engine, Clock, str]:
    clock = Clock()
    return Engine(backend.open(), clock=clock), clock, unique


def create(engine: Engine, unique: str, **budget: int) -> str:
    spec = load_spec(QUADRATIC.format(unique=unique))
    for name, value in budget.items():
        setattr(spec.budget, name, value)
    study_id, created = engine.create_study(spec)
    assert created
    return study_id


def publish(engine: Engine, outcome: Outcome) -> list[tuning_pb2.TrialRequested]:
    for request in outcome.requests:
        engine.mark_published(request)
    return outcome.requests


def test_a_study_keeps_to_max_parallel_and_ends_with_exactly_max_trials(
    engine: tuple[Engine, Clock, str],
) -> None:
    tuner, _, unique = engine
    study_id = create(tuner, unique)
    in_flight: dict[str, tuning_pb2.TrialRequested] = {}
    most = 0
    while tuner.state(study_id) == api.STUDY_STATE_RUNNING:
        for request in publish(tuner, tuner.ask(study_id)):
            in_flight[request.trial_id] = request
        most = max(most, len(in_flight))
        # Trainers finish one trial at a time, oldest first.
        request = in_flight.pop(next(iter(in_flight)))
        tuner.apply(completed(request, quadratic(request)))

    assert most == 3
    assert tuner.counts(study_id) == {"completed": 10}
    best = tuner.best(study_id)
    assert best is not None and best.value is not None and best.value < 4.0


def test_reports_are_idempotent_and_stale_attempts_are_ignored(
    engine: tuple[Engine, Clock, str],
) -> None:
    tuner, _, unique = engine
    study_id = create(tuner, unique)
    first, second, _third = publish(tuner, tuner.ask(study_id))

    progress = report(first, progress=tuning_pb2.TrialProgress(step=1, value=5.0))
    tuner.apply(progress)
    tuner.apply(report(first, progress=tuning_pb2.TrialProgress(step=1, value=99.0)))
    tuner.apply(completed(first, 2.5))
    tuner.apply(completed(first, 0.1))  # a repeat after the result: changes nothing
    stale = report(second, failed=tuning_pb2.TrialFailed(reason="x", retryable=True))
    stale.attempt = 0

    assert tuner.apply(stale).requests == []
    done = {t.number: t for t in tuner.trials(study_id)}[first.trial_number]
    assert done.value == 2.5 and done.intermediate_values == {1: 5.0}
    assert tuner.counts(study_id) == {"completed": 1, "requested": 2}
    unknown = tuning_pb2.TrialReport(trial_id=f"{study_id}/999", study_id=study_id)
    with pytest.raises(NotFound):
        tuner.apply(unknown)


def test_clearly_worse_intermediate_values_are_pruned(engine: tuple[Engine, Clock, str]) -> None:
    tuner, _, unique = engine
    study_id = create(tuner, unique, max_parallel=1)
    # Two trials finish with steady curves; the median rule then has peers.
    for value in (1.0, 1.2):
        (request,) = publish(tuner, tuner.ask(study_id))
        for step in (1, 2, 3):
            tuner.apply(report(request, progress=tuning_pb2.TrialProgress(step=step, value=value)))
        tuner.apply(completed(request, value))
    (bad,) = publish(tuner, tuner.ask(study_id))

    outcome = tuner.apply(report(bad, progress=tuning_pb2.TrialProgress(step=1, value=50.0)))

    assert [(c.trial_id, c.action, c.step) for c in outcome.controls] == [
        (bad.trial_id, tuning_pb2.CONTROL_ACTION_PRUNE, 1)
    ]
    assert tuner.counts(study_id) == {"completed": 2, "pruned": 1}
    # The trainer's own "pruned" report afterwards is a repeat.
    assert tuner.apply(report(bad, pruned=tuning_pb2.TrialPruned(step=1))).changed == []


def test_a_lost_trial_is_requested_again_then_quarantined(
    engine: tuple[Engine, Clock, str],
) -> None:
    tuner, clock, unique = engine
    study_id = create(tuner, unique, max_parallel=1)
    (first,) = publish(tuner, tuner.ask(study_id))

    clock.now += 30
    assert tuner.find_lost(study_id).requests == []  # within the 60 s timeout
    clock.now += 31
    (again,) = publish(tuner, tuner.find_lost(study_id))
    assert (again.trial_id, again.attempt, again.params) == (first.trial_id, 2, first.params)
    assert tuner.ask(study_id).requests == []  # still one in flight

    # The second attempt fails too: max_attempts is 2, so it is quarantined.
    failed = report(again, failed=tuning_pb2.TrialFailed(reason="oom", retryable=True))
    assert tuner.apply(failed).requests == []

    (trial,) = tuner.trials(study_id)
    assert trial_state(trial) == api.TRIAL_STATE_QUARANTINED
    assert details(trial).errors == [
        "attempt 1: no report for 60 s",
        "attempt 2: oom: ",
    ]
    (nxt,) = publish(tuner, tuner.ask(study_id))
    assert nxt.params != first.params


def test_a_configuration_at_fault_is_quarantined_at_once(
    engine: tuple[Engine, Clock, str],
) -> None:
    tuner, _, unique = engine
    study_id = create(tuner, unique, max_parallel=1)
    (request,) = publish(tuner, tuner.ask(study_id))
    failed = report(request, failed=tuning_pb2.TrialFailed(reason="nan", retryable=False))

    assert tuner.apply(failed).requests == []
    assert tuner.counts(study_id) == {"quarantined": 1}


def test_a_study_whose_code_cannot_load_fails_once_instead_of_quarantining_trial_after_trial(
    engine: tuple[Engine, Clock, str],
) -> None:
    tuner, _, unique = engine
    study_id = create(tuner, unique)
    first, *others = publish(tuner, tuner.ask(study_id))
    failure = tuning_pb2.TrialFailed(
        reason="user_code_import",
        message="cannot import task.entrypoint 'mypkg.train:train': no module 'mypkg'",
        traceback="Traceback (most recent call last):\nModuleNotFoundError: No module named "
        "'mypkg'",
        fatal_to_study=True,
    )

    outcome = tuner.apply(report(first, failed=failure))

    # The others in flight are told to stop; nothing more is asked.
    assert sorted(c.trial_id for c in outcome.controls) == sorted(o.trial_id for o in others)
    assert {c.action for c in outcome.controls} == {tuning_pb2.CONTROL_ACTION_STOP}
    assert tuner.state(study_id) == api.STUDY_STATE_FAILED
    assert tuner.error(study_id).startswith(f"trial {first.trial_number}: attempt 1: ")
    assert "no module 'mypkg'" in tuner.error(study_id)
    assert tuner.ask(study_id).requests == []
    assert tuner.counts(study_id) == {"failed": 3}
    shown = details(tuner.trial(study_id, first.trial_number))
    assert shown.traceback.endswith("No module named 'mypkg'")
    result = tuner.unannounced_result(study_id)
    assert result is not None and result.error == tuner.error(study_id) and not result.stopped


def test_a_restarted_engine_continues_the_study(
    engine: tuple[Engine, Clock, str], backend: Backend
) -> None:
    tuner, clock, unique = engine
    study_id = create(tuner, unique)
    published = publish(tuner, tuner.ask(study_id))
    tuner.apply(completed(published[0], 3.0))
    # Killed after asking, before publishing: these requests were never sent.
    unsent = tuner.ask(study_id).requests
    assert len(unsent) == 1

    restarted = Engine(backend.open(), clock=clock)
    again = restarted.unsent(study_id).requests

    assert [(r.trial_id, r.attempt) for r in again] == [(unsent[0].trial_id, 1)]
    assert restarted.ask(study_id).requests == []  # already max_parallel in flight
    assert restarted.counts(study_id) == {"completed": 1, "requested": 3}
    spec = restarted.spec(study_id)
    assert restarted.create_study(spec) == (study_id, False)
    spec.budget.max_trials = 99
    with pytest.raises(AlreadyExists):
        restarted.create_study(spec)


def test_stopping_a_study_stops_its_trials(engine: tuple[Engine, Clock, str]) -> None:
    tuner, _, unique = engine
    study_id = create(tuner, unique)
    requests = publish(tuner, tuner.ask(study_id))

    outcome = tuner.stop(study_id)

    assert {c.trial_id for c in outcome.controls} == {r.trial_id for r in requests}
    assert {c.action for c in outcome.controls} == {tuning_pb2.CONTROL_ACTION_STOP}
    assert tuner.state(study_id) == api.STUDY_STATE_STOPPED
    assert tuner.ask(study_id).requests == []
    with pytest.raises(NotFound):
        tuner.spec("no-such-study")


def test_the_time_limit_ends_a_study_once_its_trials_finish(
    engine: tuple[Engine, Clock, str],
) -> None:
    tuner, clock, unique = engine
    spec = load_spec(QUADRATIC.format(unique=unique))
    spec.budget.time_limit.FromSeconds(10)
    study_id, _ = tuner.create_study(spec)
    first = publish(tuner, tuner.ask(study_id))

    clock.now += 11
    assert tuner.ask(study_id).requests == []  # no new trial after the limit
    assert tuner.state(study_id) == api.STUDY_STATE_RUNNING  # three still in flight
    for request in first:
        tuner.apply(completed(request, quadratic(request)))

    assert tuner.state(study_id) == api.STUDY_STATE_COMPLETED
    result = tuner.unannounced_result(study_id)
    assert result is not None and dict(result.trial_counts) == {"completed": 3}
    tuner.mark_announced(study_id)
    assert tuner.unannounced_result(study_id) is None


def test_a_trial_asked_by_a_tuner_killed_mid_ask_is_dropped_and_replaced(
    engine: tuple[Engine, Clock, str], backend: Backend
) -> None:
    tuner, clock, unique = engine
    study_id = create(tuner, unique, max_parallel=1)
    # What a tuner killed inside Optuna's ask leaves: a running trial with
    # only some parameters and none of the engine's own records.
    cut_short = optuna.load_study(study_name=study_id, storage=backend.open()).ask()
    cut_short.suggest_float("x", -4.0, 4.0)

    restarted = Engine(backend.open(), clock=clock)
    assert restarted.unsent(study_id).requests == []
    (request,) = restarted.ask(study_id).requests

    assert request.trial_number == cut_short.number + 1
    assert set(request.params) == {"x", "y"}
    assert restarted.counts(study_id) == {"requested": 1}  # the dropped one is not counted


def test_a_refit_trains_the_best_parameters_once_more_after_the_budget(
    engine: tuple[Engine, Clock, str],
) -> None:
    tuner, _, unique = engine
    spec = load_spec(QUADRATIC.format(unique=unique))
    spec.budget.max_trials, spec.budget.max_parallel, spec.refit = 3, 1, True
    study_id, _ = tuner.create_study(spec)
    for _ in range(3):
        (request,) = publish(tuner, tuner.ask(study_id))
        # The same at step 1: the median rule prunes none of them.
        step = tuning_pb2.TrialProgress(step=1, value=1.0)
        tuner.apply(report(request, progress=step))
        tuner.apply(completed(request, quadratic(request)))
    best = tuner.best(study_id)
    assert best is not None

    assert tuner.state(study_id) == api.STUDY_STATE_RUNNING  # the refit is due
    (refit,) = publish(tuner, tuner.ask(study_id))
    assert refit.trial_number == 3 and refit.task.options["refit"] == "true"
    assert {k: search_space.python_value(v) for k, v in refit.params.items()} == best.params
    assert tuner.ask(study_id).requests == []  # once
    # Worse than every other trial at step 1, where the median rule prunes:
    # a refit reports on data it trains on and is never pruned by it.
    worst = tuning_pb2.TrialProgress(step=1, value=1e9)
    assert tuner.apply(report(refit, progress=worst)).controls == []
    # Better than every trial (on data it trained on): still not the best.
    done = tuning_pb2.TrialCompleted(value=-1.0, model_name="m", model_version="4")
    tuner.apply(report(refit, completed=done))

    assert tuner.state(study_id) == api.STUDY_STATE_COMPLETED
    after = tuner.best(study_id)
    assert after is not None and after.number == best.number  # the refit is not a candidate
    result = tuner.unannounced_result(study_id)
    assert result is not None
    assert (result.refit_model_name, result.refit_model_version) == ("m", "4")
    assert dict(result.trial_counts) == {"completed": 4}


def test_a_grid_runs_every_point_once_and_ends_by_its_budget(
    engine: tuple[Engine, Clock, str],
) -> None:
    tuner, _, unique = engine
    spec = load_spec(QUADRATIC.format(unique=unique))
    del spec.params[:]
    choices = spec.params.add(name="fold").categorical.choices
    for fold in range(4):
        choices.add().int_value = fold
    spec.sampler.Clear()
    spec.sampler.kind = tuning_pb2.SAMPLER_KIND_GRID
    spec.budget.max_trials, spec.budget.max_parallel = 4, 4
    study_id, _ = tuner.create_study(spec)
    requests = publish(tuner, tuner.ask(study_id))
    # Optuna's grid stops the study when its last point ends, which raises
    # outside study.optimize; the budget ends it here.
    for request in requests:
        tuner.apply(completed(request, float(request.params["fold"].int_value)))
    assert sorted(r.params["fold"].int_value for r in requests) == [0, 1, 2, 3]
    assert tuner.state(study_id) == api.STUDY_STATE_COMPLETED
