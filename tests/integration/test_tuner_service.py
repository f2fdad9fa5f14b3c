"""svc_tuner as a process on a real broker and Redis, driven over gRPC, with an
analytic trainer consuming its trials."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from confluent_kafka.admin import AdminClient

from aistack import cli
from aistack.studies import load_spec
from shared.bus.groups import partition_owners
from shared.bus.producer import BusProducer
from shared.bus.topics import partition_count
from shared.contracts.aistack.v1 import events_pb2, tuning_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.contracts.aistack.v1.tuner_service_pb2_grpc import TunerServiceStub
from shared.rpc.client import open_channel
from tests.infra import Infra, read_topic, wait_until
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
    spec = load_spec(SPEC.format(unique=unique, trials=8))

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
    # The first requests (trials 0-2) round-robin over the partitions; each
    # later one to the partition of a trial that ended (its trainer is free).
    # One consumer reads several partitions in no set order, so go by number.
    count = partition_count(infra.kafka, topics.trials)
    by_number = sorted(trainer.received, key=lambda r: r.trial_number)
    first = [trainer.partitions[r.trial_id] for r in by_number[:3]]
    assert first == [n % count for n in range(3)]
    assert {trainer.partitions[r.trial_id] for r in trainer.received} <= set(first)
    values = [t.value for t in trials.trials]
    assert best.trial.value == min(values)
    assert [i.step for i in best.trial.intermediate_values] == [1, 2]
    assert not again.created and again.study.trial_counts == {"completed": 8}
    (announced,) = [
        tuning_pb2.StudyResult.FromString(v)
        for v in read_topic(infra.kafka, topics.results, wanted=1, timeout=30)
    ]
    assert (announced.study_id, announced.stopped) == (spec.name, False)
    assert announced.best_value == best.trial.value
    assert announced.best_trial_id == best.trial.trial_id
    assert dict(announced.best_params) == dict(best.trial.params)
    assert dict(announced.trial_counts) == {"completed": 8}


def test_with_as_many_in_flight_as_trainers_the_first_requests_go_one_to_each(
    infra: Infra, topics: TunerTopics, unique: str, tmp_path: Path
) -> None:
    """Three partitions, two trainers: the range assignor gives one of them
    partitions 0 and 1. The tuner asks the group whose partition is whose,
    so neither trainer waits while the other queues (by round-robin, trials
    0 and 1 went to partitions 0 and 1, both the same trainer's)."""
    group = f"trainers-{unique}"
    tuner = TunerProcess(infra, topics, f"test-tuner:{unique}", tmp_path, trainer_group=group)
    range_assignor = {"partition.assignment.strategy": "range"}
    trainers = [
        AnalyticTrainer(
            infra.kafka, topics, group=group, name=name, consumer_config=range_assignor
        ).start()
        for name in "ab"
    ]
    admin = AdminClient(infra.kafka.client_config())
    try:
        described: list[dict[int, str]] = []

        def settled() -> bool:
            # Members named by their client ids, both holding partitions.
            owners = partition_owners(admin, group, topics.trials) or {}
            described.append(owners)
            return len(owners) == 3 and set(owners.values()) == {"a", "b"}

        wait_until(settled, timeout=60, message=f"the trainers' group: {described[-3:]}")
        owners = described[-1]
        assert owners[0] == owners[1] != owners[2]  # the range assignor's split
        text = SPEC.format(unique=unique, trials=4).replace("max_parallel: 3", "max_parallel: 2")
        spec = load_spec(text)

        async def scenario() -> None:
            await _wait_ready(tuner.target)
            async with open_channel(tuner.target) as channel:
                stub = TunerServiceStub(channel)
                created = await stub.CreateStudy(api.CreateStudyRequest(spec=spec))
                await _watch_to_the_end(stub, created.study.study_id)

        asyncio.run(scenario())
    finally:
        for trainer in trainers:
            trainer.stop()
        tuner.close()
    trained_by = {r.trial_number: t.name for t in trainers for r in t.received}
    assert len(trained_by) == 4
    assert {trained_by[0], trained_by[1]} == {"a", "b"}


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
    spec = load_spec(SPEC.format(unique=unique, trials=4) + yaml_change + "\n")

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
    spec = load_spec(SPEC.format(unique=unique, trials=4))
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


def _run_study(target: str, spec: tuning_pb2.StudySpec) -> list[api.Trial]:
    async def scenario() -> list[api.Trial]:
        await _wait_ready(target)
        async with open_channel(target) as channel:
            stub = TunerServiceStub(channel)
            created = await stub.CreateStudy(api.CreateStudyRequest(spec=spec))
            await _watch_to_the_end(stub, created.study.study_id)
            listed = await stub.ListTrials(api.ListTrialsRequest(study_id=spec.name))
            return list(listed.trials)

    return asyncio.run(scenario())


def run_pruned_study(
    infra: Infra, topics: TunerTopics, tuner: TunerProcess, unique: str, pruner: str
) -> tuple[tuning_pb2.StudySpec, list[api.Trial]]:
    """Five trials of three epochs on the analytic trainer under ``pruner``:
    the first three good, the rest a hundred times worse (pruned); the spec
    and the trials once the study ended."""
    spec = load_spec(
        SPEC.format(unique=unique, trials=5)
        + f"pruner: {pruner}\nbudget: {{max_trials: 5, max_parallel: 1}}\ntask: "
        "{dataset: analytic, framework: FRAMEWORK_TORCH, epochs: 3}\n"
    )

    def objective(request: tuning_pb2.TrialRequested) -> float:
        return 1.0 if request.trial_number < 3 else 100.0

    trainer = AnalyticTrainer(
        infra.kafka, topics, group=f"trainers-{unique}", epochs=3, objective=objective
    ).start()
    try:
        return spec, _run_study(tuner.target, spec)
    finally:
        trainer.stop()


@pytest.mark.parametrize(
    "pruner",
    [
        "{kind: PRUNER_KIND_MEDIAN, startup_trials: 2}",
        "{kind: PRUNER_KIND_SUCCESSIVE_HALVING, min_resource: 1, reduction_factor: 2}",
    ],
)
def test_clearly_worse_trials_get_prune_messages(
    infra: Infra, topics: TunerTopics, tuner: TunerProcess, unique: str, pruner: str
) -> None:
    spec, trials = run_pruned_study(infra, topics, tuner, unique, pruner)
    states = {t.number: t.state for t in trials}
    assert states == {
        0: api.TRIAL_STATE_COMPLETED,
        1: api.TRIAL_STATE_COMPLETED,
        2: api.TRIAL_STATE_COMPLETED,
        3: api.TRIAL_STATE_PRUNED,
        4: api.TRIAL_STATE_PRUNED,
    }
    controls = [
        tuning_pb2.TrialControl.FromString(v)
        for v in read_topic(infra.kafka, topics.control, wanted=2, timeout=30)
    ]
    assert sorted((c.trial_id, c.action) for c in controls) == [
        (f"{spec.name}/3", tuning_pb2.CONTROL_ACTION_PRUNE),
        (f"{spec.name}/4", tuning_pb2.CONTROL_ACTION_PRUNE),
    ]


def test_lost_trials_are_requested_again_and_poison_is_quarantined(
    infra: Infra, topics: TunerTopics, tuner: TunerProcess, unique: str
) -> None:
    spec = load_spec(
        SPEC.format(unique=unique, trials=4)
        + "budget: {max_trials: 4, max_parallel: 2, trial_timeout: 2s, max_attempts: 2}\n"
    )
    trainer = AnalyticTrainer(
        infra.kafka,
        topics,
        group=f"trainers-{unique}",
        # Trial 0's first trainer dies; trial 1 fails every time.
        vanish=lambda r: r.trial_number == 0 and r.attempt == 1,
        failure=lambda r: (
            tuning_pb2.TrialFailed(reason="diverged", message="loss is nan", retryable=True)
            if r.trial_number == 1
            else None
        ),
    ).start()
    try:
        trials = _run_study(tuner.target, spec)
    finally:
        trainer.stop()

    by_number = {t.number: t for t in trials}
    assert by_number[0].state == api.TRIAL_STATE_COMPLETED and by_number[0].attempts == 2
    assert by_number[1].state == api.TRIAL_STATE_QUARANTINED
    assert list(by_number[1].errors) == [
        "attempt 1: diverged: loss is nan",
        "attempt 2: diverged: loss is nan",
    ]
    asked = sorted((r.trial_number, r.attempt) for r in trainer.received if r.trial_number < 2)
    assert asked == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert len(trials) == 4


def test_a_tuner_killed_mid_study_is_restarted_and_finishes_it(
    infra: Infra, topics: TunerTopics, tuner: TunerProcess, unique: str, tmp_path: Path
) -> None:
    spec = load_spec(SPEC.format(unique=unique, trials=10))
    trainer = AnalyticTrainer(infra.kafka, topics, group=f"trainers-{unique}").start()

    async def create() -> None:
        await _wait_ready(tuner.target)
        async with open_channel(tuner.target) as channel:
            await TunerServiceStub(channel).CreateStudy(api.CreateStudyRequest(spec=spec))

    restarted = None
    try:
        asyncio.run(create())
        wait_until(lambda: len(trainer.completed) >= 4, 60, "four trials trained")
        tuner.kill()  # kill -9, mid-study
        restarted = TunerProcess(infra, topics, f"test-tuner:{unique}", tmp_path)
        trials = _run_study(restarted.target, spec)  # CreateStudy again: the same study
    finally:
        trainer.stop()
        if restarted is not None:
            restarted.close()

    # Exactly the budget, each trial once (a trial the kill cut short inside
    # ask is dropped and replaced, so numbers may skip one).
    assert len(trials) == 10 and len({t.number for t in trials}) == 10
    assert {t.state for t in trials} == {api.TRIAL_STATE_COMPLETED}


def test_the_cli_creates_watches_shows_and_stops_studies(
    infra: Infra,
    topics: TunerTopics,
    tuner: TunerProcess,
    unique: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec_file = tmp_path / "study.yaml"
    spec_file.write_text(SPEC.format(unique=unique, trials=4))
    asyncio.run(_wait_ready(tuner.target))
    trainer = AnalyticTrainer(infra.kafka, topics, group=f"trainers-{unique}").start()
    study_id = f"analytic-{unique}"
    tuner_flag = ["study", "--tuner", tuner.target]
    try:
        assert cli.main([*tuner_flag, "create", "-f", str(spec_file), "--watch"]) == 0
        created = capsys.readouterr().out.splitlines()
        assert cli.main([*tuner_flag, "best", study_id]) == 0
        best = capsys.readouterr().out
        assert cli.main([*tuner_flag, "show", study_id]) == 0
        shown = capsys.readouterr().out
    finally:
        trainer.stop()
    # No trainer now: a second study stays running until stopped.
    spec_file.write_text(SPEC.format(unique=unique + "-b", trials=4))
    assert cli.main([*tuner_flag, "create", "-f", str(spec_file)]) == 0
    assert cli.main([*tuner_flag, "stop", f"analytic-{unique}-b"]) == 0
    stopped = capsys.readouterr().out
    assert cli.main([*tuner_flag, "show", "no-such-study"]) == 1

    assert created[0] == f"study {study_id} created"
    assert "4/4" in created[-2] and "completed 4" in created[-2] and "best " in created[-2]
    assert created[-1] == f"study {study_id}: STUDY_STATE_COMPLETED"
    assert best.startswith("trial ") and "(completed)" in best and "x=" in best
    assert shown.startswith(f"study {study_id}: STUDY_STATE_COMPLETED; completed 4")
    assert stopped.splitlines()[-1] == f"study analytic-{unique}-b: STUDY_STATE_STOPPED"
    assert "NOT_FOUND" in capsys.readouterr().err
