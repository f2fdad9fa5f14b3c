"""A TensorFlow ``multi_worker_mirrored`` trial as Spark barrier tasks
(``task.options.launcher: spark``, ``backends.tensorflow.spark``): each task
sets its ``TF_CONFIG`` from the barrier's addresses, the chief reports
through the driver every epoch and exports a SavedModel the model server
loads. A built-in family on ``local[2]``; and a training loop of the user's,
shipped with its study over the bus, on a standalone master with two workers."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shared.artifacts import digest
from shared.contracts.aistack.v1 import models_pb2
from shared.contracts.aistack.v1 import tuner_service_pb2 as api
from shared.model_loading import load
from shared.settings import SparkSettings
from svc_trainer import trials
from svc_trainer.backends import spark_launch
from svc_trainer.backends.tensorflow import runner as tf_runner
from svc_trainer.plan import RunResult, RunSpec, StopReason, TrialError
from tests.infra import Infra
from tests.integration.trainer_service import trial_request
from tests.integration.trainer_support import RecordingChannel, digits_splits, run_spec
from tests.integration.user_stack import UserStack, study_spec
from tests.spark_cluster import StandaloneCluster, standalone_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DIGITS = digits_splits(limit=256)
LOOPS = Path(__file__).resolve().parent / "user_loops"


def mwms_spec(tmp: Path, spark: SparkSettings, **overrides: Any) -> RunSpec:
    given: dict[str, Any] = {
        "framework": "tensorflow",
        "strategy": "multi_worker_mirrored",
        "world_size": 2,
        "epochs": 2,
        "threads": 1,
        "options": {"launcher": "spark"},
        "spark": spark,
        "spark_work_dir": str(tmp / "spark"),
        **overrides,
    }
    return run_spec(tmp, **given)


def served(spec: RunSpec, result: RunResult) -> np.ndarray:
    """The exported model, loaded as svc_model loads it, on the test split."""
    sha, size = digest(Path(spec.export_dir))
    event = trials.model_ready(
        trial_request("spark-tf", 0, strategy="multi_worker_mirrored"),
        result,
        None,
        artifact_uri=spec.export_dir,
        sha256=sha,
        size_bytes=size,
        trainer_id="test",
    )
    model = load(event, Path(spec.export_dir))
    return model.run({model.inputs[0].name: DIGITS.x_test})[model.outputs[0].name]


@pytest.fixture(scope="module")
def local_spark() -> Iterator[SparkSettings]:
    yield SparkSettings(master="local[2]", conf={"spark.ui.enabled": "false"})
    spark_launch.stop_session()


def test_a_built_in_family_trains_on_two_barrier_tasks_and_exports_from_the_chief(
    tmp_path: Path, local_spark: SparkSettings
) -> None:
    spec = mwms_spec(tmp_path, local_spark, model_family="mlp")
    channel = RecordingChannel()
    result = tf_runner.run(spec, DIGITS, channel)
    assert result.stopped is StopReason.NONE and result.epochs_completed == 2
    assert channel.started_events() == [(0, "")]
    assert [step for step, _ in channel.epochs()] == [1, 2]
    assert "val_error" in result.val_metrics and "test_error" in result.test_metrics
    assert result.export_format == "tf_saved_model"
    probabilities = served(spec, result)
    assert probabilities.shape == (len(DIGITS.y_test), 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    # Every epoch left a checkpoint, written by the chief on this host.
    assert any((tmp_path / "checkpoints").iterdir())


def test_more_workers_than_local_cores_is_refused_at_once(
    tmp_path: Path, local_spark: SparkSettings
) -> None:
    spec = mwms_spec(tmp_path, local_spark, world_size=3, model_family="mlp")
    with pytest.raises(TrialError, match="runs 2 tasks at once") as raised:
        tf_runner.run(spec, DIGITS, RecordingChannel())
    assert raised.value.reason == "invalid_params"


def test_a_multi_host_tf_config_for_multi_worker_mirrored_points_at_the_spark_launcher(
    tmp_path: Path,
) -> None:
    config = '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}'
    spec = run_spec(
        tmp_path, framework="tensorflow", strategy="multi_worker_mirrored", tf_config=config
    )
    with pytest.raises(TrialError, match="launcher: spark"):
        tf_runner.run(spec, DIGITS, RecordingChannel())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(
        tmp_path_factory.mktemp("spark-tf-cluster"), cores=1, workers=2
    ) as started:
        yield started
        spark_launch.stop_session()


def test_a_users_loop_over_the_bus_runs_in_each_worker_of_a_standalone_master_with_two_workers(
    infra: Infra, tmp_path: Path, cluster: StandaloneCluster
) -> None:
    """A study on the bus (the tuner, a trainer whose Spark is the standalone
    master, the model server): the shipped loop trains on two barrier tasks,
    one on each worker, and the model it exports is served."""
    spark_launch.stop_session()  # a session of this process on another master
    spark = cluster.settings()
    stack = UserStack(
        infra,
        tmp_path,
        trainers=1,
        trainer_env={
            "AISTACK_SPARK_MASTER": spark.master,
            "AISTACK_SPARK_CONF": json.dumps(spark.conf),
            # Before the loop's first report come the trial's Spark session on
            # the master and TensorFlow's import in both barrier tasks: over
            # UserStack's 20 s on a loaded machine (a silent loop is
            # test_user_code's to find).
            "AISTACK_TRAINER_EXECUTOR_STALL_SECONDS": "300",
        },
    )
    try:
        name = f"mwms-{uuid.uuid4().hex[:6]}"
        study = stack.run_study(
            study_spec(
                "spark-mwms",
                {
                    "framework": "FRAMEWORK_TENSORFLOW",
                    "dataset": "digits",
                    "entrypoint": "testloops.keras_loop:train",
                    "strategy": "multi_worker_mirrored",
                    "world_size": 2,
                    "options": {"launcher": "spark"},
                    "model_name": name,
                },
                params=[{"name": "width", "categorical": {"choices": [{"int_value": 16}]}}],
                budget={"max_trials": 1, "max_parallel": 1, "trial_timeout": "400s"},
            ),
            code=LOOPS,
            timeout=420,
        )
        assert study.state == api.STUDY_STATE_COMPLETED, stack.logs()
        (trial,) = stack.client.trials(study.study_id)
        steps = [
            r.progress.step
            for r in stack.reports(trial.trial_id)
            if r.WhichOneof("event") == "progress"
        ]
        assert steps == [1, 2, 3]
        event = stack.model_ready(name, trial.model_version)
        assert event.format == models_pb2.ARTIFACT_FORMAT_TF_SAVED_MODEL
        assert event.labels["strategy"] == "multi_worker_mirrored"
        got = stack.predict(name, DIGITS.x_test[:3], version=event.version)
        assert np.asarray(got["outputs"]["output"]).shape == (3, 10)
        # Both barrier tasks ran on the master's workers, one core each.
        assert [app["name"] for app in cluster.applications()] == [spark_launch.APP_NAME]
    finally:
        stack.close()
