"""A user's code under the strategies and launchers a built-in family runs
under: a model of theirs cut by model parallelism (and refused when it
cannot be) and trained by two DDP ranks; a loop of theirs under torchrun and
as TorchDistributor's Spark tasks; a Keras model of theirs under each
single-host tf.distribute strategy and in a local MultiWorkerMirrored
cluster, and a TensorFlow loop of theirs there too. The code is shipped as a package, as a study
ships it, and put on each process's path from there."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from aistack.studies import ship_code
from shared.contracts.aistack.v1 import common_pb2
from shared.settings import SparkSettings
from svc_trainer.backends import spark_launch
from svc_trainer.backends.torch import runner as torch_runner
from svc_trainer.plan import CodeRef, StopReason, TrialError
from tests.integration.test_trainer_tf import digits, epochs_of, make_spec, run_fresh
from tests.integration.trainer_service import trial_request
from tests.integration.trainer_support import RecordingChannel, digits_splits, run_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

LOOPS = Path(__file__).resolve().parent / "user_loops"
DIGITS = digits_splits(limit=240)


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> tuple[common_pb2.CodePackage, CodeRef]:
    root = tmp_path_factory.mktemp("shipped")
    package = ship_code(LOOPS, str(root / "store"))
    return package, CodeRef(package.uri, package.sha256, str(root / "code" / package.sha256))


def test_model_parallel_cuts_a_users_sequential_and_refuses_what_it_cannot_cut(
    tmp_path: Path, code: tuple[common_pb2.CodePackage, CodeRef]
) -> None:
    _, ref = code
    given: dict[str, Any] = {"model_family": "", "code": ref, "strategy": "model_parallel"}
    spec = run_spec(tmp_path / "cut", model="testloops.models:sequential", **given)
    result = torch_runner.run(spec, DIGITS, RecordingChannel())
    assert result.epochs_completed == 2 and result.export_format == "torch_export"
    with pytest.raises(TrialError, match=r"cuts an nn\.Sequential") as refused:
        torch_runner.run(
            run_spec(tmp_path / "plain", model="testloops.models:plain", **given),
            DIGITS,
            RecordingChannel(),
        )
    assert refused.value.reason == "invalid_params"


def test_a_users_model_trains_under_ddp_in_two_local_ranks(
    tmp_path: Path, code: tuple[common_pb2.CodePackage, CodeRef]
) -> None:
    _, ref = code
    spec = run_spec(
        tmp_path,
        model_family="",
        model="testloops.models:sequential",
        code=ref,
        strategy="ddp",
        world_size=2,
        threads=1,
    )
    channel = RecordingChannel()
    result = torch_runner.run(spec, DIGITS, channel)
    assert result.stopped is StopReason.NONE and result.epochs_completed == 2
    assert [step for step, _ in channel.epochs()] == [1, 2]
    # The ranks stayed in step: one set of weights at the end.
    assert len(set(result.replica_digests)) == 1 and len(result.replica_digests) == 2
    assert result.export_format == "torch_export"


def test_a_users_loop_runs_in_each_rank_under_torchrun(
    tmp_path: Path, code: tuple[common_pb2.CodePackage, CodeRef]
) -> None:
    package, _ = code
    request = trial_request(
        "torchrun-user",
        0,
        strategy="ddp",
        epochs=3,
        model_family="",
        metric="val_loss",
        params={"lr": 0.05},
    )
    request.task.entrypoint = "testloops.slow:train"
    request.task.code.CopyFrom(package)
    request.params["pause"].float_value = 0.0
    trial = tmp_path / "trial.json"
    trial.write_text(json_format.MessageToJson(request))
    done = subprocess.run(
        [str(Path(sys.executable).with_name("torchrun")), "--standalone",
         "--nproc-per-node", "2", "-m", "svc_trainer.backends.torch.torchrun", str(trial),
         "--out", str(tmp_path / "out"), "--device", "cpu"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # A rank's failure is a JSON line on stdout (reason, traceback); torchrun's on stderr.
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1500:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [e["step"] for e in events if e["event"] == "epoch"] == [1, 2, 3]
    (completed,) = [e for e in events if e["event"] == "completed"]
    assert completed["epochs"] == 3 and completed["model_uri"] == ""  # the loop exports none


@pytest.fixture(scope="module")
def local_spark() -> Iterator[SparkSettings]:
    yield SparkSettings(master="local[2]", conf={"spark.ui.enabled": "false"})
    spark_launch.stop_session()


def test_a_users_loop_runs_as_torch_distributors_spark_tasks_and_exports_from_rank_0(
    tmp_path: Path, local_spark: SparkSettings, code: tuple[common_pb2.CodePackage, CodeRef]
) -> None:
    _, ref = code
    spec = run_spec(
        tmp_path,
        strategy="ddp",
        world_size=2,
        threads=1,
        model_family="",
        entrypoint="testloops.slow:train",
        objective_metric="val_loss",
        params={"pause": 0.0},
        epochs=2,
        code=ref,
        options={"launcher": "spark"},
        spark=local_spark,
        spark_work_dir=str(tmp_path / "spark"),
    )
    channel = RecordingChannel()
    result = torch_runner.run(spec, DIGITS, channel)
    assert result.stopped is StopReason.NONE and result.epochs_completed == 2
    assert [step for step, _ in channel.epochs()] == [1, 2]
    assert channel.started_events() == [(0, "")]


@pytest.mark.parametrize(
    ("strategy", "world_size"),
    [("multi_worker_mirrored", 2), ("mirrored", 1), ("central_storage", 1)],
)
def test_a_users_keras_model_trains_under_each_tf_strategy_of_one_host(
    tmp_path: Path,
    code: tuple[common_pb2.CodePackage, CodeRef],
    strategy: str,
    world_size: int,
) -> None:
    _, ref = code
    spec = make_spec(
        tmp_path,
        strategy=strategy,
        world_size=world_size,
        model_family="",
        model="testloops.models:keras_mlp",
        code=ref,
        epochs=2,
    )
    run = run_fresh(spec, digits())
    assert run.error == "" and run.result is not None
    assert run.result.epochs_completed == 2 and run.result.export_format == "tf_saved_model"
    assert [step for step, _ in epochs_of(run.events)] == [1, 2]


def test_a_users_tensorflow_loop_runs_in_every_worker_of_a_local_cluster(
    tmp_path: Path, code: tuple[common_pb2.CodePackage, CodeRef]
) -> None:
    _, ref = code
    spec = make_spec(
        tmp_path,
        strategy="multi_worker_mirrored",
        world_size=2,
        model_family="",
        entrypoint="testloops.keras_loop:train",
        objective_metric="val_loss",
        code=ref,
        epochs=2,
    )
    run = run_fresh(spec, digits())
    assert run.error == "" and run.result is not None
    assert [step for step, _ in epochs_of(run.events)] == [1, 2]
    assert [o.name for o in run.result.outputs] == ["output"]
