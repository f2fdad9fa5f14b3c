"""``aistack.v1.TunerService`` over the tuner; errors raised here are mapped to
status codes by the shared server (InvalidArgument → INVALID_ARGUMENT, …)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from optuna.trial import FrozenTrial

from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1 import tuner_service_pb2_grpc
from shared.errors import InvalidArgument
from svc_tuner import spec as specs
from svc_tuner.engine import Engine, trial_id
from svc_tuner.service import Tuner

SERVICE_NAME = "aistack.v1.TunerService"


def trial_message(engine: Engine, study_id: str, trial: FrozenTrial) -> api.Trial:
    details = engine.details(trial)
    message = api.Trial(
        trial_id=trial_id(study_id, trial.number),
        study_id=study_id,
        number=trial.number,
        state=engine.trial_state(trial),  # type: ignore[arg-type]
        attempts=details.attempts,
        errors=details.errors,
        trainer_id=details.trainer_id,
        metrics=details.metrics,
        model_name=details.model_name,
        model_version=details.model_version,
    )
    for name, value in trial.params.items():
        message.params[name].CopyFrom(specs.param_value(value))
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
    spec = engine.spec(study_id)
    message = api.Study(
        study_id=study_id,
        spec=spec,
        state=engine.state(study_id),  # type: ignore[arg-type]
        trial_counts=engine.counts(study_id),
    )
    message.create_time.FromSeconds(int(engine.created(study_id)))
    best = engine.best(study_id)
    if best is not None:
        message.best_trial.CopyFrom(trial_message(engine, study_id, best))
    return message


def trial_messages(engine: Engine, study_id: str, states: frozenset[int]) -> list[api.Trial]:
    out = [trial_message(engine, study_id, t) for t in engine.trials(study_id)]
    return [t for t in out if not states or t.state in states]


class TunerServicer(tuner_service_pb2_grpc.TunerServiceServicer):
    def __init__(self, tuner: Tuner) -> None:
        self._tuner = tuner

    async def CreateStudy(self, request: api.CreateStudyRequest, context: Any) -> Any:
        if not request.HasField("spec"):
            raise InvalidArgument("spec: missing")
        study_id, created = await self._tuner.call(self._tuner.create_study, request.spec)
        study = await self._study(study_id)
        return api.CreateStudyResponse(study=study, created=created)

    async def GetStudy(self, request: api.GetStudyRequest, context: Any) -> Any:
        return api.GetStudyResponse(study=await self._study(request.study_id))

    async def ListTrials(self, request: api.ListTrialsRequest, context: Any) -> Any:
        engine = self._tuner.engine
        states = frozenset(request.states)
        trials = await self._tuner.call(trial_messages, engine, request.study_id, states)
        return api.ListTrialsResponse(trials=trials)

    async def StopStudy(self, request: api.StopStudyRequest, context: Any) -> Any:
        await self._tuner.call(self._tuner.stop_study, request.study_id)
        return api.StopStudyResponse(study=await self._study(request.study_id))

    async def GetBestTrial(self, request: api.GetBestTrialRequest, context: Any) -> Any:
        study = await self._study(request.study_id)
        if not study.HasField("best_trial"):
            await context.abort(grpc.StatusCode.NOT_FOUND, "no trial has completed yet")
        return api.GetBestTrialResponse(trial=study.best_trial)

    async def WatchStudy(
        self, request: api.WatchStudyRequest, context: Any
    ) -> AsyncIterator[api.WatchStudyResponse]:
        """Every trial as it is now, then each change, until the study ends."""
        tuner, study_id = self._tuner, request.study_id
        queue = tuner.watch(study_id)
        try:
            study = await self._study(study_id)  # NOT_FOUND before anything is sent
            for trial in await tuner.call(trial_messages, tuner.engine, study_id, frozenset()):
                yield api.WatchStudyResponse(trial=trial, study_state=study.state)
            state: int = study.state
            while state == api.STUDY_STATE_RUNNING:
                changed = await queue.get()
                trial, state = await tuner.call(self._trial_and_state, study_id, changed)
                yield api.WatchStudyResponse(trial=trial, study_state=state)  # type: ignore[arg-type]
            # Changes made before the study ended are queued by then (the engine
            # thread queues them before it answers): send their final states.
            last = set()
            while not queue.empty():
                last.add(queue.get_nowait())
            for changed in sorted(last):
                trial, state = await tuner.call(self._trial_and_state, study_id, changed)
                yield api.WatchStudyResponse(trial=trial, study_state=state)  # type: ignore[arg-type]
        finally:
            tuner.unwatch(study_id, queue)

    def _trial_and_state(self, study_id: str, changed: str) -> tuple[api.Trial, int]:
        engine = self._tuner.engine
        trial = engine.trial(study_id, int(changed.rpartition("/")[2]))
        return trial_message(engine, study_id, trial), engine.state(study_id)

    async def _study(self, study_id: str) -> api.Study:
        return await self._tuner.call(study_message, self._tuner.engine, study_id)


def register(tuner: Tuner) -> Any:
    def add(server: grpc.aio.Server) -> None:
        servicer = TunerServicer(tuner)
        tuner_service_pb2_grpc.add_TunerServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]

    return add
