"""svc_tuner as a process on a real broker and Redis, driven over gRPC, with an
analytic trainer consuming its trials."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import events_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub
from shared.rpc.client import open_channel
from svc_tuner import spec as specs
from tests.infra import Infra, read_topic
from tests.integration.tuner_service import AnalyticTrainer, TunerProcess, TunerTopics

SPEC = """
name: analytic-{unique}
objective: {{metric: loss, direction: DIRECTION_MINIMIZE}}
params:
  - {{name: x, float_range: {{low: -4.0, high: 4.0}}}}
  - {{name: y, int_range: {{low: -3, high: 3}}}}
sampler: {{kind: SAMPLER_KIND_TPE, startup_trials: 3}}
pruner: {{kind: PRUNER_KIND_NONE}}
budget: {{max_trials: {trials}, max_parallel: 3, trial_timeout: 30s, max_attempts: 2}}
task: {{dataset: analytic, framework: FRAMEWORK_TORCH, epochs: 2}}
seed: 5
"""


@pytest.fixture
def topics(infra: Infra, unique: str) -> TunerTopics:
    created = TunerTopics.unique(unique)
    created.create(infra.kafka)
    return created


@pytest.fixture
def tuner(infra: Infra, topics: TunerTopics, unique: str, tmp_path: Path) -> Iterator[TunerProcess]:
    process = TunerProcess(infra, topics, f"test-tuner:{unique}", tmp_path)
    yield process
    process.close()


async def _wait_ready(target: str) -> None:
    async with open_channel(target) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=60)


async def _watch_to_the_end(stub: TunerServiceStub, study_id: str) -> list[api.WatchStudyResponse]:
    updates = []
    async for update in stub.WatchStudy(api.WatchStudyRequest(study_id=study_id), timeout=180):
        updates.append(update)
    return updates


def test_a_study_runs_to_completion_over_the_bus(
    infra: Infra, topics: TunerTopics, tuner: TunerProcess, unique: str
) -> None:
    trainer = AnalyticTrainer(infra.kafka, topics, group=f"trainers-{unique}").start()
    spec = specs.load_spec(SPEC.format(unique=unique, trials=8))

    async def scenario() -> tuple:  # type: ignore[type-arg]
        await _wait_ready(tuner.target)
        async with open_channel(tuner.target) as channel:
            stub = TunerServiceStub(channel)
            created = await stub.CreateStudy(api.CreateStudyRequest(spec=spec))
            updates = await _watch_to_the_end(stub, created.study.study_id)
            trials = await stub.ListTrials(api.ListTrialsRequest(study_id=created.study.study_id))
            best = await stub.GetBestTrial(api.GetBestTrialRequest(study_id=spec.name))
            again = await stub.CreateStudy(api.CreateStudyRequest(spec=spec))
            return created, updates, trials, best, again

    try:
        created, updates, trials, best, again = asyncio.run(scenario())
    finally:
        trainer.stop()

    assert created.created and created.study.state == api.STUDY_STATE_RUNNING
    assert updates[-1].study_state == api.STUDY_STATE_COMPLETED
    assert [t.state for t in trials.trials] == [api.TRIAL_STATE_COMPLETED] * 8
    assert trainer.max_in_flight == 3  # max_parallel, reached and never exceeded
    assert len(trainer.received) == 8  # each trial requested once
    values = [t.value for t in trials.trials]
    assert best.trial.value == min(values)
    assert [i.step for i in best.trial.intermediate_values] == [1, 2]
    assert not again.created and again.study.trial_counts == {"completed": 8}


@pytest.mark.parametrize(
    ("yaml_change", "field"),
    [
        ("params: []", "params"),
        ("params: [{name: x, float_range: {low: 2.0, high: 1.0}}]", "params[0].float_range.low"),
        (
            "params: [{name: lr, float_range: {low: 0.0, high: 1.0, log: true}}]",
            "params[0].float_range.low",
        ),
        ("budget: {max_trials: 4, max_parallel: 0}", "budget.max_parallel"),
    ],
)
def test_invalid_specs_are_invalid_arguments_naming_the_field(
    tuner: TunerProcess, unique: str, yaml_change: str, field: str
) -> None:
    spec = specs.load_spec(SPEC.format(unique=unique, trials=4) + yaml_change + "\n")

    async def create() -> grpc.aio.AioRpcError:
        await _wait_ready(tuner.target)
        async with open_channel(tuner.target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await TunerServiceStub(channel).CreateStudy(api.CreateStudyRequest(spec=spec))
            return raised.value

    error = asyncio.run(create())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith(field)


def test_an_unknown_sampler_and_an_unknown_study(tuner: TunerProcess, unique: str) -> None:
    spec = specs.load_spec(SPEC.format(unique=unique, trials=4))
    spec.sampler.kind = 77  # type: ignore[assignment]

    async def calls() -> tuple[grpc.aio.AioRpcError, grpc.aio.AioRpcError]:
        await _wait_ready(tuner.target)
        async with open_channel(tuner.target) as channel:
            stub = TunerServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as sampler:
                await stub.CreateStudy(api.CreateStudyRequest(spec=spec))
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await stub.GetStudy(api.GetStudyRequest(study_id="no-such-study"))
            return sampler.value, unknown.value

    sampler, unknown = asyncio.run(calls())
    assert sampler.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (sampler.details() or "").startswith("sampler.kind")
    assert unknown.code() == grpc.StatusCode.NOT_FOUND


def test_bad_reports_are_dead_lettered(
    infra: Infra, topics: TunerTopics, tuner: TunerProcess
) -> None:
    producer = BusProducer(infra.kafka, source="test")
    producer.publish_raw(topics.reports, b"\x00 not a report", key=b"x", headers=[])
    stray = tuning_pb2.TrialReport(
        trial_id="no-such-study/3",
        study_id="no-such-study",
        attempt=1,
        heartbeat=tuning_pb2.TrialHeartbeat(step=1),
    )
    producer.publish(topics.reports, stray, key="no-such-study")
    producer.flush()

    letters = [
        events_pb2.DeadLetter.FromString(v)
        for v in read_topic(infra.kafka, topics.dlq, wanted=2, timeout=60)
    ]

    assert len(letters) == 2 and "unknown_trial" in {letter.reason for letter in letters}
    assert {letter.source.topic for letter in letters} == {topics.reports}
    assert b"\x00 not a report" in {letter.original_value for letter in letters}
