"""``aistack.v1.TunerService`` over the tuner; errors raised here are mapped to
status codes by the shared server (InvalidArgument → INVALID_ARGUMENT,
NotFound → NOT_FOUND, FailedPrecondition → FAILED_PRECONDITION, …)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1 import tuner_service_pb2_grpc
from shared.errors import InvalidArgument
from svc_tuner.service import Tuner

SERVICE_NAME = "aistack.v1.TunerService"


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
        states = frozenset(request.states)
        trials = await self._tuner.call(self._tuner.trials, request.study_id, states)
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
            for trial in await tuner.call(tuner.trials, study_id):
                yield api.WatchStudyResponse(trial=trial, study_state=study.state)
            state: int = study.state
            while state == api.STUDY_STATE_RUNNING:
                changed = await queue.get()
                trial, state = await tuner.call(tuner.trial_and_state, changed)
                yield api.WatchStudyResponse(trial=trial, study_state=state)  # type: ignore[arg-type]
            # Changes made before the study ended are queued by then (the engine
            # thread queues them before it answers): send their final states.
            last = set()
            while not queue.empty():
                last.add(queue.get_nowait())
            for changed in sorted(last):
                trial, state = await tuner.call(tuner.trial_and_state, changed)
                yield api.WatchStudyResponse(trial=trial, study_state=state)  # type: ignore[arg-type]
        finally:
            tuner.unwatch(study_id, queue)

    async def ReplayStudy(self, request: api.ReplayStudyRequest, context: Any) -> Any:
        return await self._tuner.call(self._tuner.replay, request.study_id)

    async def _study(self, study_id: str) -> api.Study:
        return await self._tuner.call(self._tuner.study, study_id)


def register(tuner: Tuner) -> Any:
    def add(server: grpc.aio.Server) -> None:
        servicer = TunerServicer(tuner)
        tuner_service_pb2_grpc.add_TunerServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]

    return add
