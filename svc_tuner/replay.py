"""Replaying a study from its log: the proposals again, nothing trained.

A fresh in-memory Optuna study with the logged study's name (Hyperband's
brackets hash it), direction, pruner, space and sampler seeding
(``spec.seeded_sampler``: a proposal depends only on the seed, the trial's
number and the history) is driven through the log's events in the order
they happened: each trial asked at its start, told at its end (its
intermediate values reported first, its logged value and state told back).
A trial whose parameters were fixed in advance (a warm start's, a refit's:
Optuna's ``fixed_params``) is enqueued just before it is asked, as the
engine did. Skipped trials are replayed too: they were asked, and the
sampler saw them. Every replayed proposal is compared with the logged one.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from typing import Any

import optuna
from optuna.storages import InMemoryStorage
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from shared import search_space
from shared.contracts.aistack.v1 import common_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from svc_tuner import spec as specs
from svc_tuner.record import is_skipped, trial_state

FIXED_PARAMS = "fixed_params"  # Optuna's system attribute for enqueued trials

_TELL, _ASK = 0, 1  # at equal times a tell goes first: the engine tells, then asks


def replay(spec: tuning_pb2.StudySpec, trials: Sequence[FrozenTrial]) -> api.ReplayStudyResponse:
    """The study ``spec`` with the logged ``trials`` (every one, skipped ones
    included), replayed. Trials never asked (still waiting) are left out."""
    storage = InMemoryStorage()
    study = optuna.create_study(
        storage=storage,
        study_name=spec.name,
        direction=search_space.direction(spec),
        sampler=specs.seeded_sampler(spec),
        pruner=specs.pruner(spec),
    )
    space = search_space.distributions(spec)
    response = api.ReplayStudyResponse(study_id=spec.name, task=spec.task)
    numbers: dict[int, int] = {}
    for kind, trial in _events([t for t in trials if t.state != OptunaState.WAITING]):
        if kind == _ASK:
            fixed = trial.system_attrs.get(FIXED_PARAMS)
            if fixed is not None:
                study.enqueue_trial(fixed, skip_if_exists=False)
            asked = study.ask(space)
            numbers[trial.number] = asked.number
            response.trials.append(_compared(trial, asked.params, enqueued=fixed is not None))
            continue
        number = numbers[trial.number]
        tid = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
        for step, value in sorted(trial.intermediate_values.items()):
            storage.set_trial_intermediate_value(tid, step, value)
        if trial.state == OptunaState.COMPLETE and trial.value is not None:
            study.tell(number, trial.value)
        elif trial.state == OptunaState.PRUNED:
            study.tell(number, state=OptunaState.PRUNED)
        else:
            study.tell(number, state=OptunaState.FAIL)
    response.identical = all(t.matches for t in response.trials)
    return response


def _events(trials: Sequence[FrozenTrial]) -> Iterator[tuple[int, FrozenTrial]]:
    """Asks and tells in the order they happened; a tell never before its ask."""
    timed: list[tuple[datetime.datetime, int, int, FrozenTrial]] = []
    for trial in trials:
        start = trial.datetime_start or datetime.datetime.min
        timed.append((start, _ASK, trial.number, trial))
        if trial.state.is_finished():
            timed.append((trial.datetime_complete or start, _TELL, trial.number, trial))
    timed.sort(key=lambda event: event[:3])
    asked: set[int] = set()
    held: dict[int, FrozenTrial] = {}
    for _, kind, number, trial in timed:
        if kind == _TELL and number not in asked:
            held[number] = trial  # the same instant as its ask: after it
            continue
        yield kind, trial
        if kind == _ASK:
            asked.add(number)
            if number in held:
                yield _TELL, held.pop(number)


def _compared(trial: FrozenTrial, replayed: dict[str, Any], *, enqueued: bool) -> api.ReplayedTrial:
    logged = trial.params
    if is_skipped(trial):
        # Cut short inside Optuna's ask by a crash, a skipped trial may hold
        # only some parameters: those are what it proposed.
        replayed = {k: v for k, v in replayed.items() if k in logged}
    message = api.ReplayedTrial(
        number=trial.number,
        logged_params=_values(logged),
        replayed_params=_values(replayed),
        state=trial_state(trial),  # type: ignore[arg-type]
        enqueued=enqueued,
    )
    message.matches = dict(message.logged_params) == dict(message.replayed_params)
    if trial.value is not None:
        message.value = trial.value
    return message


def _values(params: dict[str, Any]) -> dict[str, common_pb2.ParamValue]:
    return {name: search_space.param_value(value) for name, value in params.items()}
