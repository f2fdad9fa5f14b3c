"""The tuner's part of the closed loop on a real broker and Redis: a finished
study replays to its proposals over gRPC and through the CLI; drift events
on the drift topic start exactly one warm-started re-tune, whose result says
whether its model beats the serving one."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from aistack import cli
from aistack.studies import load_spec
from shared import search_space
from shared.bus.producer import BusProducer
from shared.contracts.aistack.v1 import models_pb2, monitoring_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub
from shared.objective import baseline_metric
from shared.rpc.client import open_channel
from tests.infra import Infra, read_topic, wait_until
from tests.integration import test_tuner_service
from tests.integration.test_tuner_service import SPEC, _run_study, _wait_ready
from tests.integration.tuner_service import AnalyticTrainer, TunerProcess, TunerTopics

# The same tuner on the same kind of topics as test_tuner_service's tests.
topics = test_tuner_service.topics
tuner = test_tuner_service.tuner


def _replay(target: str, study_id: str) -> api.ReplayStudyResponse:
    async def call() -> api.ReplayStudyResponse:
        async with open_channel(target) as channel:
            stub = TunerServiceStub(channel)
            return await stub.ReplayStudy(api.ReplayStudyRequest(study_id=study_id))

    return asyncio.run(call())


def _params(params: object) -> dict[str, object]:
    return {k: search_space.python_value(v) for k, v in params.items()}  # type: ignore[attr-defined]


def test_a_finished_study_replays_twice_to_its_own_proposals(
    infra: Infra,
    topics: TunerTopics,
    tuner: TunerProcess,
    unique: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Three trials in flight at a time (the trainer queues those it has not
    # started), reported as each is trained.
    spec = load_spec(SPEC.format(unique=unique, trials=8))
    trainer = AnalyticTrainer(infra.kafka, topics, group=f"trainers-{unique}").start()
    try:
        trials = _run_study(tuner.target, spec)
    finally:
        trainer.stop()
    assert trainer.max_in_flight == 3

    first, second = _replay(tuner.target, spec.name), _replay(tuner.target, spec.name)

    assert first.identical and second.identical
    assert first == second
    assert [t.number for t in first.trials] == [t.number for t in trials]
    for replayed, logged in zip(first.trials, trials, strict=True):
        assert dict(replayed.replayed_params) == dict(logged.params)
        assert replayed.value == logged.value and replayed.state == logged.state
    assert first.task == spec.task
    # The CLI: a line per trial and the verdict; exit 0 when identical.
    tuner_flag = ["study", "--tuner", tuner.target]
    assert cli.main([*tuner_flag, "replay", spec.name]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 9 and "logged = replayed" in lines[0]
    assert lines[-1] == f"study {spec.name}: replay identical: 8 trials proposed as logged"
    assert cli.main([*tuner_flag, "replay", spec.name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["identical"] is True


def test_replaying_a_running_or_unknown_study_is_refused(tuner: TunerProcess, unique: str) -> None:
    spec = load_spec(SPEC.format(unique=unique, trials=4))  # no trainer: it stays running

    async def calls() -> tuple[grpc.aio.AioRpcError, grpc.aio.AioRpcError]:
        await _wait_ready(tuner.target)
        async with open_channel(tuner.target) as channel:
            stub = TunerServiceStub(channel)
            await stub.CreateStudy(api.CreateStudyRequest(spec=spec))
            with pytest.raises(grpc.aio.AioRpcError) as running:
                await stub.ReplayStudy(api.ReplayStudyRequest(study_id=spec.name))
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await stub.ReplayStudy(api.ReplayStudyRequest(study_id="no-such-study"))
            return running.value, unknown.value

    running, unknown = asyncio.run(calls())
    assert running.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "replay a finished study" in (running.details() or "")
    assert unknown.code() == grpc.StatusCode.NOT_FOUND


def _drift(study_id: str, drift_id: str) -> monitoring_pb2.DriftDetected:
    drift = monitoring_pb2.DriftDetected(
        drift_id=drift_id,
        model_name="analytic",
        model_version="2",
        feature="x@tumbling-60s",
        study_id=study_id,
        serving=models_pb2.ModelReady(model_name="analytic", version="2"),
    )
    drift.first_window_start.FromJsonString("2024-05-01T10:00:00Z")
    drift.last_window_start.FromJsonString("2024-05-01T11:00:00Z")
    return drift


def _study(target: str, study_id: str) -> api.Study | None:
    async def call() -> api.Study | None:
        async with open_channel(target) as channel:
            try:
                got = await TunerServiceStub(channel).GetStudy(
                    api.GetStudyRequest(study_id=study_id)
                )
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                raise
            return got.study

    return asyncio.run(call())


def _trials(target: str, study_id: str) -> list[api.Trial]:
    async def call() -> list[api.Trial]:
        async with open_channel(target) as channel:
            stub = TunerServiceStub(channel)
            listed = await stub.ListTrials(api.ListTrialsRequest(study_id=study_id))
            return list(listed.trials)

    return asyncio.run(call())


def test_drift_starts_exactly_one_warm_started_retune_and_the_champion_rule_decides(
    infra: Infra, topics: TunerTopics, tuner: TunerProcess, unique: str
) -> None:
    spec = load_spec(
        SPEC.format(unique=unique, trials=6)
        + "retune: {on_drift: true, max_trials: 4, warm_trials: 2}\n"
    )
    root = spec.name
    # The serving version's value on each re-tune's data: worse than any
    # trial's (the quadratic is at least 0) for the first, better for the second.
    serving_value = {f"{root}-retune-1": 1000.0, f"{root}-retune-2": -1.0}
    trainer = AnalyticTrainer(
        infra.kafka,
        topics,
        group=f"trainers-{unique}",
        metrics=lambda r: (
            {baseline_metric("loss"): serving_value[r.study_id]}
            if r.study_id in serving_value
            else {}
        ),
    ).start()
    producer = BusProducer(infra.kafka, source="test-monitor")
    try:
        previous = _run_study(tuner.target, spec)
        ranked = sorted(previous, key=lambda t: (t.value, t.number))
        # A storm: the same drift three times and another for the same model.
        for drift_id in ("d1", "d1", "d1", "d2"):
            producer.publish(topics.drift, _drift(root, drift_id), key="analytic")
        producer.flush()
        wait_until(lambda: tuner.log_text().count('"drift.ignored"') >= 3, 60, "the storm decided")
        first_id = f"{root}-retune-1"
        wait_until(
            lambda: (s := _study(tuner.target, first_id)) is not None
            and s.state == api.STUDY_STATE_COMPLETED,
            120,
            "the re-tune finished",
        )
        retune_trials = _trials(tuner.target, first_id)
        # The loop goes on: a drift of the re-tune's model starts the next.
        producer.publish(topics.drift, _drift(first_id, "d3"), key="analytic")
        producer.flush()
        second_id = f"{root}-retune-2"
        wait_until(
            lambda: (s := _study(tuner.target, second_id)) is not None
            and s.state == api.STUDY_STATE_COMPLETED,
            120,
            "the second re-tune finished",
        )
        replayed = _replay(tuner.target, first_id)
    finally:
        trainer.stop()

    # Exactly one study for the storm, the drift ids decided once.
    log = tuner.log_text()
    assert log.count('"study.retune_started"') == 2
    assert log.count('"drift.ignored"') == 3
    assert '"why": "retune_running"' in log and '"why": "repeat"' in log
    # Its first trials are the previous study's best, best first.
    by_number = sorted(retune_trials, key=lambda t: t.number)
    assert len(by_number) == 4
    assert [_params(t.params) for t in by_number[:2]] == [
        _params(ranked[0].params),
        _params(ranked[1].params),
    ]
    requests = [r for r in trainer.received if r.study_id == first_id]
    assert {r.task.baseline.version for r in requests} == {"2"}
    assert {r.task.options["window_from"] for r in requests} == {"2024-05-01T10:00:00Z"}
    assert {r.task.options["window_to"] for r in requests} == {"2024-05-01T11:00:00Z"}
    assert replayed.identical
    assert [t.enqueued for t in replayed.trials] == [True, True, False, False]
    # The champion rule: promoted where the serving version is worse on the
    # same data, refused where it is better.
    results = {
        r.study_id: r
        for r in (
            tuning_pb2.StudyResult.FromString(v)
            for v in read_topic(infra.kafka, topics.results, wanted=3, timeout=60)
        )
    }
    promoted, refused = results[first_id].retune, results[second_id].retune
    assert (promoted.drift_id, promoted.previous_study_id) == ("d1", root)
    assert promoted.promoted and promoted.serving_value == 1000.0
    assert "beats the serving version 2's 1000" in promoted.reason
    assert (refused.drift_id, refused.previous_study_id) == ("d3", first_id)
    assert not refused.promoted and refused.serving_value == -1.0
    assert refused.reason.endswith("version 2 keeps serving")
    assert not results[root].HasField("retune")
    # Logged just after the result is published.
    wait_until(
        lambda: tuner.log_text().count('"study.retune_decided"') == 2, 30, "both decisions logged"
    )
