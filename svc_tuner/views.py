"""The engine's studies and trials as ``aistack.v1`` messages: what the gRPC
layer answers, built in the engine's thread (``Tuner``'s gRPC section)."""

from __future__ import annotations

from optuna.trial import FrozenTrial

from shared import search_space
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from svc_tuner.engine import Engine
from svc_tuner.record import details, trial_id, trial_state


def trial_message(study_id: str, trial: FrozenTrial) -> api.Trial:
    shown = details(trial)
    message = api.Trial(
        trial_id=trial_id(study_id, trial.number),
        study_id=study_id,
        number=trial.number,
        state=trial_state(trial),  # type: ignore[arg-type]
        attempts=shown.attempts,
        errors=shown.errors,
        trainer_id=shown.trainer_id,
        metrics=shown.metrics,
        model_name=shown.model_name,
        model_version=shown.model_version,
        traceback=shown.traceback,
    )
    for name, value in trial.params.items():
        message.params[name].CopyFrom(search_space.param_value(value))
    if trial.value is not None:
        message.value = trial.value
    for step, value in sorted(trial.intermediate_values.items()):
        message.intermediate_values.add(step=step, value=value)
    if trial.datetime_start:
        message.start_time.FromDatetime(trial.datetime_start)
    if trial.datetime_complete:
        message.end_time.FromDatetime(trial.datetime_complete)
    return message


def study_message(engine: Engine, study_id: str) -> api.Study:
    message = api.Study(
        study_id=study_id,
        spec=engine.spec(study_id),
        state=engine.state(study_id),  # type: ignore[arg-type]
        trial_counts=engine.counts(study_id),
        error=engine.error(study_id),
    )
    message.create_time.FromSeconds(int(engine.created(study_id)))
    best = engine.best(study_id)
    if best is not None:
        message.best_trial.CopyFrom(trial_message(study_id, best))
    return message


def trial_messages(engine: Engine, study_id: str, states: frozenset[int]) -> list[api.Trial]:
    """The study's trials in ``states`` (every trial for none)."""
    out = [trial_message(study_id, t) for t in engine.trials(study_id)]
    return [t for t in out if not states or t.state in states]
