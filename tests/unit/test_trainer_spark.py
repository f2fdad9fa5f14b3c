"""``launcher: spark``: which trials may ask for it, and the line between a
Spark-launched trial's rank 0 and its driver (a real socket, no Spark)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from shared.contracts.aistack.v1 import common_pb2, tuning_pb2
from svc_trainer import trials
from svc_trainer.backends.spark_channel import (
    DriverChannel,
    ProgressServer,
    RankFailure,
    report_failure,
)
from svc_trainer.plan import Hyperparams, RunSpec, StopReason, TrialError

SPEC = RunSpec(
    trial_id="s/0",
    study_id="s",
    trial_number=0,
    attempt=1,
    dataset="digits",
    model_family="cnn",
    framework="torch",
    strategy="ddp",
    world_size=2,
    epochs=1,
    hparams=Hyperparams(),
    seed=1,
    objective_metric="val_error",
    checkpoint_dir="c",
    export_dir="e",
    tensorboard_dir="t",
)


@pytest.mark.parametrize(
    ("options", "expected"),
    [({}, "local"), ({"launcher": ""}, "local"), ({"launcher": "local"}, "local")],
)
def test_a_trial_starts_its_processes_on_this_node_unless_it_asks(
    options: dict[str, str], expected: str
) -> None:
    assert trials.launcher(replace(SPEC, options=options)) == expected


def test_a_torch_ddp_trial_may_ask_for_spark() -> None:
    assert trials.launcher(replace(SPEC, options={"launcher": "spark"})) == "spark"


def test_a_tensorflow_multi_worker_trial_may_ask_for_spark() -> None:
    spec = replace(
        SPEC,
        framework="tensorflow",
        strategy="multi_worker_mirrored",
        options={"launcher": "spark"},
    )
    assert trials.launcher(spec) == "spark"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"options": {"launcher": "yarn"}}, r"launcher.*'yarn': expected one of local, spark"),
        ({"strategy": "single"}, "multi_worker_mirrored trials only, not torch single"),
        ({"strategy": ""}, "multi_worker_mirrored trials only, not torch default"),
        ({"framework": "tensorflow", "strategy": "mirrored"}, "not tensorflow mirrored"),
    ],
)
def test_other_launchers_and_spark_elsewhere_are_refused(
    overrides: dict[str, object], message: str
) -> None:
    spec = replace(SPEC, **{"options": {"launcher": "spark"}, **overrides})  # type: ignore[arg-type]
    with pytest.raises(TrialError, match=message) as refused:
        trials.launcher(spec)
    assert refused.value.reason == "invalid_params"


def test_the_trainer_refuses_a_bad_launcher_before_any_run(tmp_path: Path) -> None:
    request = tuning_pb2.TrialRequested(
        trial_id="s/0",
        study_id="s",
        task=tuning_pb2.TrainingTask(
            dataset="digits",
            framework=common_pb2.FRAMEWORK_TORCH,
            strategy="single",
            epochs=1,
            options={"launcher": "spark"},
        ),
        objective=common_pb2.Objective(metric="val_error"),
    )
    with pytest.raises(TrialError, match="runs torch ddp and tensorflow"):
        trials.run_spec(
            request,
            checkpoint_dir=tmp_path / "c",
            export_dir=tmp_path / "e",
            tensorboard_dir=tmp_path / "t",
            device="cpu",
            threads=0,
            world_size=2,
        )


class Recording:
    """A driver-side channel: records what reaches it, asks to stop after
    ``stop_after`` epochs."""

    def __init__(self, stop_after: int = 99) -> None:
        self.events: list[tuple[str, object, object]] = []
        self.stop_after = stop_after
        self.asked = 0

    def started(self, resumed_from_step: int, note: str = "") -> None:
        self.events.append(("started", resumed_from_step, note))

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        self.events.append(("epoch", step, dict(metrics)))

    def stop_requested(self) -> StopReason:
        self.asked += 1
        epochs = sum(1 for kind, _, _ in self.events if kind == "epoch")
        return StopReason.PRUNE if epochs >= self.stop_after else StopReason.NONE


@pytest.fixture
def driver() -> Iterator[tuple[ProgressServer, Recording]]:
    channel = Recording(stop_after=1)
    with ProgressServer("127.0.0.1", channel) as server:
        yield server, channel


def test_rank_0s_reports_reach_the_drivers_channel_and_its_stop_comes_back(
    driver: tuple[ProgressServer, Recording],
) -> None:
    server, channel = driver
    rank0 = DriverChannel(server.address, timeout=10)
    try:
        rank0.started(2, "resumed")
        assert rank0.stop_requested() is StopReason.NONE
        rank0.epoch(3, {"loss": 0.5, "val_error": float("nan")})
        assert rank0.stop_requested() is StopReason.PRUNE
    finally:
        rank0.close()
    assert channel.events[0] == ("started", 2, "resumed")
    kind, step, metrics = channel.events[1]
    assert (kind, step) == ("epoch", 3)
    assert isinstance(metrics, dict) and metrics["loss"] == 0.5
    assert metrics["val_error"] != metrics["val_error"]  # NaN survives the line
    assert server.failure is None


def test_a_client_without_the_runs_token_is_dropped_unheard(
    driver: tuple[ProgressServer, Recording],
) -> None:
    server, channel = driver
    stranger = DriverChannel(replace(server.address, token="0" * 32), timeout=10)
    with pytest.raises(ConnectionError, match="refused this run"):
        stranger.started(0)
    assert channel.events == []


def test_the_first_rank_failure_is_kept(driver: tuple[ProgressServer, Recording]) -> None:
    server, channel = driver
    first = RankFailure(0, "IsADirectoryError", "checkpoint", "")
    report_failure(server.address, first)
    report_failure(server.address, RankFailure(1, "RuntimeError", "peer gone", ""))
    assert server.failure == first
    assert first.line() == "rank 0 failed: IsADirectoryError: checkpoint"
    assert channel.events == []


def test_the_driver_checks_in_for_the_ranks_while_spark_launches_them_and_not_after() -> None:
    # The trainer's stall watch counts checks: tens of seconds of Spark
    # getting executors and the ranks importing their framework are no stall.
    channel = Recording()
    with ProgressServer("127.0.0.1", channel, launch_check_s=0.01) as server:
        deadline = time.monotonic() + 10
        while channel.asked < 3:
            assert time.monotonic() < deadline, "the driver never checked in"
            time.sleep(0.01)
        rank0 = DriverChannel(server.address, timeout=10)
        try:
            rank0.started(0)
            asked = channel.asked
            time.sleep(0.2)  # twenty launch checks' time
            assert channel.asked == asked  # from started on, only the ranks' checks count
            assert rank0.stop_requested() is StopReason.NONE
            assert channel.asked == asked + 1
        finally:
            rank0.close()
