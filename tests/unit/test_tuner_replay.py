"""Deterministic proposals and replayable studies: a proposal depends only on
the spec's seed, the trial's number and the study's history, so a restarted
tuner proposes what the killed one would have, and a finished study's log
replays to the same proposals; a log that was changed does not."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from optuna.storages import BaseStorage, InMemoryStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend

from aistack.studies import describe_replay, load_spec
from shared import search_space
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1 import tuning_pb2
from shared.errors import FailedPrecondition, NotFound
from svc_tuner.engine import Engine
from svc_tuner.replay import replay
from tests.unit.test_tuner_engine import QUADRATIC, Clock, completed, publish, quadratic, report


def _storages(kind: str, tmp_path: Path, name: str) -> BaseStorage:
    if kind == "memory":
        return InMemoryStorage()
    return JournalStorage(JournalFileBackend(str(tmp_path / f"{name}.log")))


def _params(request: tuning_pb2.TrialRequested) -> dict[str, object]:
    return {k: search_space.python_value(v) for k, v in request.params.items()}


def _drive(engine_for_step: object, study_id: str, steps: int) -> list[dict[str, object]]:
    """Asks and completes trials two at a time; ``engine_for_step(i)`` is the
    engine used at step ``i`` (the same one, or a fresh one on the storage)."""
    proposed: list[dict[str, object]] = []
    for step in range(steps):
        engine: Engine = engine_for_step(step)  # type: ignore[operator]
        requests = publish(engine, engine.ask(study_id))
        proposed += [_params(r) for r in requests]
        # Reports arrive in another order than the requests went out.
        for request in reversed(requests):
            engine.apply(completed(request, quadratic(request)))
    return proposed


@pytest.mark.parametrize("kind", ["memory", "journal-file"])
def test_a_fresh_engine_on_the_same_storage_proposes_what_the_first_would_have(
    kind: str, tmp_path: Path, unique: str
) -> None:
    spec = load_spec(QUADRATIC.format(unique=unique))
    spec.budget.max_trials, spec.budget.max_parallel = 10, 2
    # One engine all along, on one storage ...
    steady = Engine(_storages(kind, tmp_path, "steady"), clock=Clock())
    steady.create_study(spec)
    kept = _drive(lambda _: steady, spec.name, 5)
    # ... and a new engine (a restarted tuner: new sampler objects) at every
    # step, on another.
    storage = _storages(kind, tmp_path, "restarted")
    Engine(storage, clock=Clock()).create_study(spec)
    reopened = storage if kind == "memory" else None

    def fresh(_: int) -> Engine:
        again = reopened or JournalStorage(JournalFileBackend(str(tmp_path / "restarted.log")))
        return Engine(again, clock=Clock())

    restarted = _drive(fresh, spec.name, 5)

    assert len(kept) == 10
    assert restarted == kept
    assert len({str(p) for p in kept}) == 10  # sampled, not one point repeated


def _finished_study(engine: Engine, unique: str) -> str:
    """Parallel trials (three in flight), reports out of order, a pruned
    trial, a trial that fails at fault (quarantined), a tuner restart."""
    spec = load_spec(QUADRATIC.format(unique=unique))
    spec.budget.max_trials, spec.budget.max_parallel = 9, 3
    study_id, _ = engine.create_study(spec)
    first = publish(engine, engine.ask(study_id))
    assert len(first) == 3
    for request in first[1:]:
        engine.apply(report(request, progress=tuning_pb2.TrialProgress(step=1, value=1.0)))
        engine.apply(completed(request, quadratic(request) + 1.0))
    # Far worse than the median at step 1: pruned.
    pruned = engine.apply(report(first[0], progress=tuning_pb2.TrialProgress(step=1, value=1e6)))
    assert [c.action for c in pruned.controls] == [tuning_pb2.CONTROL_ACTION_PRUNE]
    live = {r.trial_number: r for r in publish(engine, engine.ask(study_id))}
    failure = tuning_pb2.TrialFailed(reason="config", message="bad", retryable=False)
    engine.apply(report(live.pop(min(live)), failed=failure))
    # A restarted tuner (new sampler objects) goes on with the study.
    engine = Engine(engine._storage, clock=Clock())
    while engine.state(study_id) == api.STUDY_STATE_RUNNING:
        live |= {r.trial_number: r for r in publish(engine, engine.ask(study_id))}
        assert len(live) <= 3
        # The newest two finish, newest first: one stays in flight meanwhile.
        for number in sorted(live)[-2:][::-1]:
            request = live.pop(number)
            step = tuning_pb2.TrialProgress(step=1, value=quadratic(request))
            engine.apply(report(request, progress=step))
            engine.apply(completed(request, quadratic(request)))
    return study_id


@pytest.mark.parametrize("kind", ["memory", "journal-file"])
def test_a_finished_study_replays_to_the_same_proposals(
    kind: str, tmp_path: Path, unique: str
) -> None:
    engine = Engine(_storages(kind, tmp_path, "log"), clock=Clock())
    study_id = _finished_study(engine, unique)

    replayed = engine.replay(study_id)
    again = Engine(_storages(kind, tmp_path, "log") if kind != "memory" else engine._storage)

    assert replayed.identical
    assert replayed == again.replay(study_id)
    logged = engine.trials(study_id)
    assert [t.number for t in replayed.trials] == [t.number for t in logged]
    states = {t.state for t in replayed.trials}
    assert {api.TRIAL_STATE_PRUNED, api.TRIAL_STATE_QUARANTINED} <= states
    assert api.TRIAL_STATE_COMPLETED in states
    for trial, frozen in zip(replayed.trials, logged, strict=True):
        assert trial.matches and not trial.enqueued
        replayed_params = trial.replayed_params.items()
        assert {k: search_space.python_value(v) for k, v in replayed_params} == frozen.params
    assert replayed.task == engine.spec(study_id).task
    lines = describe_replay(replayed)
    assert lines[-1] == f"study {study_id}: replay identical: 9 trials proposed as logged"
    assert lines[0].startswith("trial 0 (pruned, sampled): logged = replayed: x=")


def test_a_changed_log_is_reported_as_a_mismatch(unique: str) -> None:
    engine = Engine(InMemoryStorage(), clock=Clock())
    study_id = _finished_study(engine, unique)
    trials = [copy.deepcopy(t) for t in engine._study(study_id).get_trials(deepcopy=False)]
    tampered = trials[4]
    tampered.params = {**tampered.params, "x": tampered.params["x"] + 0.5}

    replayed = replay(engine.spec(study_id), trials)

    assert not replayed.identical
    assert [t.number for t in replayed.trials if not t.matches] == [4]
    [differs] = [t for t in replayed.trials if not t.matches]
    assert differs.logged_params["x"].float_value == tampered.params["x"]
    assert describe_replay(replayed)[-1].endswith(
        "differs: trials 4 proposed otherwise than logged"
    )


def test_a_running_study_is_not_replayed_and_an_unknown_one_is_not_found(unique: str) -> None:
    engine = Engine(InMemoryStorage(), clock=Clock())
    study_id, _ = engine.create_study(load_spec(QUADRATIC.format(unique=unique)))
    publish(engine, engine.ask(study_id))

    with pytest.raises(FailedPrecondition, match="replay a finished study"):
        engine.replay(study_id)
    with pytest.raises(NotFound):
        engine.replay("no-such-study")
