"""A ``ddp`` trial with ``launcher: spark``: its ranks run as Spark barrier
tasks through TorchDistributor, on ``local[2]`` and on a standalone master
with one worker, and it reports, checkpoints and exports as the same trial
does with its ranks on this node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from google.protobuf import json_format

from shared.artifacts import digest
from shared.model_loading import load
from shared.settings import SparkSettings
from svc_trainer import trials
from svc_trainer.backends import spark_launch
from svc_trainer.backends.torch import runner as torch_runner
from svc_trainer.backends.torch.loop import CHECKPOINT_FILE
from svc_trainer.data import datasets
from svc_trainer.plan import DataSplits, RunResult, RunSpec, StopReason, TrialError
from tests.integration.trainer_service import trial_request
from tests.integration.trainer_support import RecordingChannel, digits_splits, run_spec
from tests.spark_cluster import StandaloneCluster, standalone_cluster

pytestmark = pytest.mark.integration

DIGITS = digits_splits()
EPOCHS = 2
WORLD = 2


@dataclass(kw_only=True)
class CheckpointChannel(RecordingChannel):
    """Also records, at each epoch report, the epoch the checkpoint on disk
    holds: a checkpoint is written before its epoch is reported."""

    checkpoint: Path
    saved: list[int]

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        self.saved.append(int(torch.load(self.checkpoint, weights_only=True)["epoch"]))
        super().epoch(step, metrics)


@dataclass(frozen=True)
class Trained:
    spec: RunSpec
    result: RunResult
    channel: CheckpointChannel


def ddp_spec(tmp: Path, spark: SparkSettings | None, **overrides: Any) -> RunSpec:
    """A ``ddp`` trial of WORLD ranks, through Spark when ``spark`` is given."""
    given: dict[str, Any] = {
        "world_size": WORLD,
        "epochs": EPOCHS,
        # One thread per rank either way, so both runs do the same arithmetic.
        "threads": 1,
        "options": {"launcher": "spark"} if spark is not None else {},
        **overrides,
    }
    return run_spec(tmp, strategy="ddp", spark=spark, spark_work_dir=str(tmp / "spark"), **given)


def train(tmp: Path, spark: SparkSettings | None) -> Trained:
    spec = ddp_spec(tmp, spark)
    channel = CheckpointChannel(checkpoint=tmp / "checkpoints" / CHECKPOINT_FILE, saved=[])
    return Trained(spec, torch_runner.run(spec, DIGITS, channel), channel)


@pytest.fixture(scope="module")
def on_this_node(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The same trial under ``ddp``, its ranks started on this node."""
    return train(tmp_path_factory.mktemp("ddp-local"), None)


@pytest.fixture(scope="module")
def local_spark() -> Iterator[SparkSettings]:
    yield SparkSettings(master="local[2]", conf={"spark.ui.enabled": "false"})
    spark_launch.stop_session()


def predictions(export: str, result: RunResult, data: DataSplits) -> np.ndarray:
    """The exported model, loaded as svc_model loads it, on the test split."""
    sha, size = digest(Path(export))
    event = trials.model_ready(
        trial_request("spark", 0, strategy="ddp"),
        result,
        None,
        artifact_uri=export,
        sha256=sha,
        size_bytes=size,
        trainer_id="test",
    )
    runner = load(event, Path(export))
    output = runner.run({runner.inputs[0].name: data.x_test})
    return output[runner.outputs[0].name]


def assert_like_on_this_node(spark: Trained, local: Trained) -> None:
    assert spark.channel.started_events() == local.channel.started_events() == [(0, "")]
    spark_epochs, local_epochs = spark.channel.epochs(), local.channel.epochs()
    assert [s for s, _ in spark_epochs] == [s for s, _ in local_epochs] == [1, 2]
    assert [set(m) for _, m in spark_epochs] == [set(m) for _, m in local_epochs]
    assert spark.channel.saved == [1, 2]  # a checkpoint each epoch, before its report

    result = spark.result
    assert result.epochs_completed == EPOCHS and result.stopped is StopReason.NONE
    assert len(result.replica_digests) == WORLD and len(set(result.replica_digests)) == 1
    # Same seed, same shards, same threads: the same weights as on this node.
    assert result.replica_digests == local.result.replica_digests
    timing = {"samples_per_s"}
    assert {k: v for k, v in result.val_metrics.items() if k not in timing} == pytest.approx(
        {k: v for k, v in local.result.val_metrics.items() if k not in timing}, rel=1e-6
    )
    assert result.test_metrics == pytest.approx(local.result.test_metrics, rel=1e-6)
    assert (result.export_format, result.inputs, result.outputs) == (
        local.result.export_format,
        local.result.inputs,
        local.result.outputs,
    )
    exported = sorted(p.name for p in Path(spark.spec.export_dir).iterdir())
    assert exported == sorted(p.name for p in Path(local.spec.export_dir).iterdir())
    np.testing.assert_allclose(
        predictions(spark.spec.export_dir, spark.result, DIGITS),
        predictions(local.spec.export_dir, local.result, DIGITS),
        rtol=1e-5,
        atol=1e-6,
    )


def test_a_torch_distributor_trial_reports_and_exports_like_a_local_one(
    tmp_path: Path, local_spark: SparkSettings, on_this_node: Trained
) -> None:
    trained = train(tmp_path, local_spark)
    assert_like_on_this_node(trained, on_this_node)


def test_a_torch_distributor_trial_reports_and_exports_like_a_torchrun_one(
    tmp_path: Path, local_spark: SparkSettings
) -> None:
    """One trial request, run by torchrun (``svc_trainer.backends.torch.torchrun``, two
    ranks on this node) and through TorchDistributor: the same reports, the
    same weights on every rank, the same exported model."""
    request = trial_request(
        "torchrun-like", 0, strategy="ddp", world_size=WORLD, options={"launcher": "spark"}
    )
    trial = tmp_path / "trial.json"
    trial.write_text(json_format.MessageToJson(request))
    torchrun = subprocess.run(
        [
            str(Path(sys.executable).with_name("torchrun")),
            *("--standalone", "--nproc-per-node", str(WORLD)),
            *("-m", "svc_trainer.backends.torch.torchrun", str(trial)),
            *("--out", str(tmp_path / "torchrun"), "--device", "cpu"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    printed = [json.loads(line) for line in torchrun.stdout.splitlines() if line.startswith("{")]
    by_kind = {kind: [e for e in printed if e["event"] == kind] for kind in ("started", "epoch")}
    (completed,) = [e for e in printed if e["event"] == "completed"]

    # The Spark run as torch_launch sets it up: the same request, data and
    # threads per rank (torchrun's share of the cores).
    spec = trials.run_spec(
        request,
        checkpoint_dir=tmp_path / "spark-run" / "checkpoints",
        export_dir=tmp_path / "spark-run" / "model",
        tensorboard_dir=tmp_path / "spark-run" / "tensorboard",
        device="cpu",
        threads=max(1, (os.cpu_count() or 1) // WORLD),
        world_size=WORLD,
        spark=local_spark,
        spark_work_dir=tmp_path / "spark-run" / "spark",
    )
    wanted = trials.data_request(request, features_path="", mnist_path="")
    data = datasets.load(wanted.dataset, wanted.options, seed=wanted.seed, features_path="")
    channel = RecordingChannel()
    result = torch_runner.run(spec, data, channel)

    assert channel.started_events() == [
        (e["resumed_from_step"], e["note"]) for e in by_kind["started"]
    ]
    assert [step for step, _ in channel.epochs()] == [e["step"] for e in by_kind["epoch"]]
    assert [set(m) for _, m in channel.epochs()] == [
        set(e) - {"event", "step"} for e in by_kind["epoch"]
    ]
    assert result.epochs_completed == completed["epochs"] == request.task.epochs
    assert list(result.replica_digests) == completed["replica_digests"]
    metrics = trials.progress_metrics({**result.val_metrics, **result.test_metrics})
    timing = {"samples_per_s"}
    assert {k: v for k, v in metrics.items() if k not in timing} == pytest.approx(
        {k: v for k, v in completed["metrics"].items() if k not in timing}, rel=1e-6
    )
    torchrun_model = tmp_path / "torchrun" / "model"
    assert sorted(p.name for p in Path(spec.export_dir).iterdir()) == sorted(
        p.name for p in torchrun_model.iterdir()
    )
    np.testing.assert_allclose(
        predictions(spec.export_dir, result, data),
        predictions(str(torchrun_model), result, data),
        rtol=1e-5,
        atol=1e-6,
    )


def test_a_prune_reaches_the_ranks_through_the_driver(
    tmp_path: Path, local_spark: SparkSettings
) -> None:
    spec = ddp_spec(tmp_path, local_spark, epochs=4)
    channel = RecordingChannel(stop_after=1)
    result = torch_runner.run(spec, DIGITS, channel)
    assert result.stopped is StopReason.PRUNE and result.epochs_completed == 1
    assert [step for step, _ in channel.epochs()] == [1]
    assert not Path(spec.export_dir).exists()


def test_a_failing_rank_is_named_with_its_error(tmp_path: Path, local_spark: SparkSettings) -> None:
    spec = ddp_spec(tmp_path, local_spark, epochs=1)
    # The checkpoint is a directory: rank 0 cannot read it to resume, nor
    # write its first epoch's there.
    (tmp_path / "checkpoints" / CHECKPOINT_FILE).mkdir(parents=True)
    with pytest.raises(RuntimeError, match=r"^ddp on Spark: rank 0 failed: IsADirectoryError: "):
        torch_runner.run(spec, DIGITS, RecordingChannel())


def test_more_ranks_than_local_cores_is_refused(tmp_path: Path, local_spark: SparkSettings) -> None:
    spec = ddp_spec(tmp_path, local_spark, world_size=3)
    with pytest.raises(TrialError, match=r"world_size 3 but local\[2\] runs 2 tasks at once"):
        torch_runner.run(spec, DIGITS, RecordingChannel())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster"), cores=2) as started:
        yield started
        spark_launch.stop_session()


def test_a_torch_distributor_trial_on_a_standalone_cluster_reports_and_exports_alike(
    tmp_path: Path, cluster: StandaloneCluster, on_this_node: Trained
) -> None:
    trained = train(tmp_path, cluster.settings())
    assert [app["name"] for app in cluster.applications()] == [spark_launch.APP_NAME]
    assert_like_on_this_node(trained, on_this_node)
