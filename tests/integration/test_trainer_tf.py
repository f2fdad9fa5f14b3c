"""The TensorFlow runner on real TensorFlow: every strategy, checkpoints,
stops, bad input and the exported SavedModel. No broker needed.

Multi-process strategies (and ``mirrored``, whose logical CPUs must be made
before TensorFlow starts) run in a fresh spawned process each, as the worker
runs a trial; the rest run in this process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from svc_trainer.backends.tensorflow import devices
from svc_trainer.backends.tensorflow import runner as tf_runner
from svc_trainer.plan import (
    DataSplits,
    Hyperparams,
    RunResult,
    RunSpec,
    StopReason,
    TrialError,
)
from tests.integration.trainer_support import (
    RecordingChannel,
    digits_splits,
    regression_splits,
    run_spec,
)

CLASSIFICATION_NAMES = {"loss", "val_loss", "val_accuracy", "val_error", "samples_per_s"}
REGRESSION_NAMES = {"loss", "val_loss", "val_mse", "val_rmse", "val_mae", "samples_per_s"}
FRESH_PROCESS_TIMEOUT_S = 240


def digits() -> DataSplits:
    """digits in an 80/10/10 split: more to train on than svc_trainer.data.datasets's 60/20/20."""
    return digits_splits(held_out=0.2)


def synthetic_regression() -> DataSplits:
    return regression_splits(rows=500, features=5)


def make_spec(tmp: Path, **overrides: Any) -> RunSpec:
    defaults: dict[str, Any] = {
        "trial_id": "study-tf/0",
        "study_id": "study-tf",
        "framework": "tensorflow",
        "strategy": "one_device",
        "seed": 7,
    }
    return run_spec(tmp, **{**defaults, **overrides})


@dataclass(kw_only=True)
class Recorder(RecordingChannel):
    """Also: after this epoch's report, SIGKILL this process's children (a
    worker crash); and the live children when the run said it started."""

    kill_children_after: int | None = None
    children_at_start: list[int] = field(default_factory=list)

    def started(self, resumed_from_step: int, note: str = "") -> None:
        super().started(resumed_from_step, note)
        self.children_at_start = children_of(os.getpid())

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        super().epoch(step, metrics)
        if step == self.kill_children_after:
            for pid in children_of(os.getpid()):
                os.kill(pid, signal.SIGKILL)


def children_of(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after the ")".
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# -- fresh processes ---------------------------------------------------------------------


@dataclass(frozen=True)
class FreshRun:
    events: list[tuple[str, int, Any]]
    result: RunResult | None
    error: str
    children_at_start: list[int]
    children_at_end: list[int]


def _fresh_main(spec: RunSpec, data: DataSplits, channel: Recorder, out: Any) -> None:
    result, error = None, ""
    try:
        result = tf_runner.run(spec, data, channel)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    out.put((channel.events, result, error, channel.children_at_start, children_of(os.getpid())))


def run_fresh(spec: RunSpec, data: DataSplits, channel: Recorder | None = None) -> FreshRun:
    """``tf_runner.run`` in a new spawned process, as the worker runs a trial,
    with ``channel`` (a copy of it) as its channel."""
    context = mp.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=_fresh_main, args=(spec, data, channel or Recorder(), out))
    process.start()
    try:
        events, result, error, at_start, at_end = out.get(timeout=FRESH_PROCESS_TIMEOUT_S)
        process.join(timeout=60)
    finally:
        if process.is_alive():
            process.kill()
            process.join()
    assert process.exitcode == 0
    return FreshRun(events, result, error, at_start, at_end)


def epochs_of(events: list[tuple[str, int, Any]]) -> list[tuple[int, dict[str, float]]]:
    return [(step, metrics) for kind, step, metrics in events if kind == "epoch"]


SERVE = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    loaded = tf.saved_model.load(sys.argv[1])
    serve = loaded.signatures["serving_default"]
    x = np.load(sys.argv[2])
    out = serve(input=tf.constant(x))
    np.save(sys.argv[3], out["probabilities"].numpy())
    """
)


# -- one_device ----------------------------------------------------------------------------


def test_one_device_trains_reports_and_exports_what_it_trained(tmp_path: Path) -> None:
    import tensorflow as tf

    data = digits()
    spec = make_spec(tmp_path)
    channel = Recorder()
    result, model = tf_runner.train(spec, data, channel)
    inputs, outputs = tf_runner.export(model, spec, data)

    assert channel.started_events() == [(0, "")]
    epochs = channel.epochs()
    assert [step for step, _ in epochs] == [1, 2]
    for _, metrics in epochs:
        assert set(metrics) == CLASSIFICATION_NAMES
        assert metrics["samples_per_s"] > 0
        assert 0.0 <= metrics["val_accuracy"] <= 1.0
        assert metrics["val_error"] == pytest.approx(1.0 - metrics["val_accuracy"])
    assert epochs[1][1]["val_loss"] < epochs[0][1]["val_loss"]
    assert result.epochs_completed == 2 and result.stopped is StopReason.NONE
    assert result.val_metrics == epochs[1][1]
    assert set(result.test_metrics) == {"test_loss", "test_accuracy", "test_error"}
    assert [(s.name, s.datatype, s.shape) for s in inputs] == [("input", "FP32", (-1, 8, 8))]
    assert [(s.name, s.datatype, s.shape) for s in outputs] == [("probabilities", "FP32", (-1, 10))]
    assert (Path(spec.export_dir) / "saved_model.pb").is_file()

    # The SavedModel, served by a process that never saw the training code.
    x = data.x_test[:50]
    np.save(tmp_path / "x.npy", x)
    subprocess.run(
        [sys.executable, "-c", SERVE, spec.export_dir, tmp_path / "x.npy", tmp_path / "p.npy"],
        check=True,
        timeout=120,
    )
    served = np.load(tmp_path / "p.npy")
    in_memory = tf.nn.softmax(model(x, training=False), axis=-1).numpy()
    assert served.shape == (50, 10) and served.dtype == np.float32
    np.testing.assert_allclose(served, in_memory, atol=1e-5)
    np.testing.assert_allclose(served.sum(axis=1), 1.0, atol=1e-5)


def test_default_hyperparameters_reach_97_percent_on_digits(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, hparams=Hyperparams(), epochs=12, seed=0)
    channel = Recorder()
    result = tf_runner.run(spec, digits(), channel)
    assert result.epochs_completed == 12
    assert result.test_metrics["test_accuracy"] >= 0.97, result.test_metrics
    assert result.export_format == "tf_saved_model"
    assert (Path(spec.export_dir) / "saved_model.pb").is_file()


# -- checkpoints ---------------------------------------------------------------------------


def test_a_longer_run_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    data = digits()
    first = Recorder()
    checkpoints = str(tmp_path / "ck")
    tf_runner.run(make_spec(tmp_path / "a", epochs=2, checkpoint_dir=checkpoints), data, first)
    assert [step for step, _ in first.epochs()] == [1, 2]

    second = Recorder()
    spec = make_spec(tmp_path / "b", epochs=3, checkpoint_dir=checkpoints)
    result = tf_runner.run(spec, data, second)
    assert second.started_events() == [(2, "")]
    assert [step for step, _ in second.epochs()] == [3]
    assert result.epochs_completed == 3 and result.export_format == "tf_saved_model"
    # Resumed weights, not fresh ones: better than one epoch from scratch.
    assert second.epochs()[0][1]["val_accuracy"] > first.epochs()[0][1]["val_accuracy"]

    # Everything already done: no training, just the evaluation and the export.
    third = Recorder()
    spec = make_spec(tmp_path / "c", epochs=3, checkpoint_dir=checkpoints)
    result = tf_runner.run(spec, data, third)
    assert third.started_events() == [(3, "")] and third.epochs() == []
    assert result.epochs_completed == 3
    assert set(result.val_metrics) == CLASSIFICATION_NAMES - {"samples_per_s"}
    assert (Path(spec.export_dir) / "saved_model.pb").is_file()


def test_a_corrupt_checkpoint_starts_over_with_a_note(tmp_path: Path) -> None:
    data = digits()
    checkpoints = tmp_path / "ck"
    tf_runner.run(
        make_spec(tmp_path / "a", epochs=2, checkpoint_dir=str(checkpoints)), data, Recorder()
    )
    files = [p for p in checkpoints.iterdir() if p.is_file()]
    assert any(p.name.endswith(".index") for p in files)
    for path in files:
        path.write_bytes(b"\x00garbage\xff" * 64)

    channel = Recorder()
    spec = make_spec(tmp_path / "b", epochs=2, checkpoint_dir=str(checkpoints))
    result = tf_runner.run(spec, data, channel)
    [(step, note)] = channel.started_events()
    assert step == 0 and "starting over" in note
    assert [s for s, _ in channel.epochs()] == [1, 2]
    assert result.epochs_completed == 2 and result.export_format == "tf_saved_model"
    # The unreadable files were put aside and fresh checkpoints written.
    assert (checkpoints / "corrupt").is_dir()
    assert (checkpoints / "ckpt-2.index").is_file()


# -- stopping ------------------------------------------------------------------------------


def test_a_prune_after_the_first_epoch_stops_without_export(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, epochs=4)
    channel = Recorder(stop_after=1, reason=StopReason.PRUNE)
    result = tf_runner.run(spec, digits(), channel)
    assert result.stopped is StopReason.PRUNE
    assert result.epochs_completed == 1
    assert [s for s, _ in channel.epochs()] == [1]
    assert result.val_metrics == channel.epochs()[0][1]
    assert result.export_format == "" and result.test_metrics == {}
    assert not Path(spec.export_dir).exists() or not any(Path(spec.export_dir).iterdir())


def test_a_stop_between_batches_abandons_the_epoch(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, epochs=3)
    channel = Recorder(stop_after=0, reason=StopReason.SHUTDOWN)
    result = tf_runner.run(spec, digits(), channel)
    assert result.stopped is StopReason.SHUTDOWN
    assert result.epochs_completed == 0 and channel.epochs() == []
    assert not list(Path(spec.checkpoint_dir).glob("ckpt-*"))


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "reason", "says"),
    [
        ({"strategy": "horovod"}, "unknown_strategy", "horovod"),
        ({"strategy": "tpu"}, "unknown_strategy", "TPU host"),
        ({"model_family": "resnet"}, "unknown_model", "resnet"),
        ({"objective_metric": "val_f1"}, "unknown_metric", "val_f1"),
        ({"strategy": "multi_worker_mirrored", "tf_config": "not json"}, "invalid_params", ""),
    ],
)
def test_bad_configurations_fail_before_training(
    tmp_path: Path, overrides: dict[str, Any], reason: str, says: str
) -> None:
    channel = Recorder()
    with pytest.raises(TrialError) as caught:
        tf_runner.run(make_spec(tmp_path, **overrides), digits(), channel)
    assert caught.value.reason == reason
    assert says in str(caught.value)
    assert channel.events == []
    assert not (tmp_path / "checkpoints").exists()


def test_a_cnn_on_feature_vectors_is_invalid(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, model_family="cnn", objective_metric="val_mse")
    with pytest.raises(TrialError) as caught:
        tf_runner.run(spec, synthetic_regression(), Recorder())
    assert caught.value.reason == "invalid_params"


# -- regression ----------------------------------------------------------------------------


def test_an_mlp_regresses_raw_features_and_exports_a_prediction(tmp_path: Path) -> None:
    import tensorflow as tf

    data = synthetic_regression()
    hp = Hyperparams(units=32, dense_layers=2, dropout=0.0, learning_rate=1e-2, batch_size=32)
    spec = make_spec(
        tmp_path, model_family="mlp", hparams=hp, epochs=6, objective_metric="val_rmse"
    )
    channel = Recorder()
    result = tf_runner.run(spec, data, channel)

    epochs = channel.epochs()
    assert [s for s, _ in epochs] == list(range(1, 7))
    for _, metrics in epochs:
        assert set(metrics) == REGRESSION_NAMES
        assert metrics["val_rmse"] == pytest.approx(np.sqrt(metrics["val_mse"]))
    # Normalised inputs learn fast: far better than predicting the mean.
    assert epochs[-1][1]["val_mse"] < 0.5 * float(np.var(data.y_val))
    assert set(result.test_metrics) == {"test_loss", "test_mse", "test_rmse", "test_mae"}
    assert [(s.name, s.shape) for s in result.outputs] == [("prediction", (-1, 1))]
    assert [(s.name, s.shape) for s in result.inputs] == [("input", (-1, 5))]

    serve = tf.saved_model.load(spec.export_dir).signatures["serving_default"]
    out = serve(input=tf.constant(data.x_test))
    assert list(out) == ["prediction"]
    predicted = out["prediction"].numpy()
    assert predicted.shape == (len(data.x_test), 1)
    mse = float(np.mean((predicted[:, 0] - data.y_test) ** 2))
    assert mse == pytest.approx(result.test_metrics["test_mse"], rel=1e-3)


# -- multi-process strategies (each in a fresh process) ------------------------------------


def assert_trained_two_epochs(run: FreshRun, spec: RunSpec) -> None:
    assert run.error == "", run.error
    assert run.result is not None
    epochs = epochs_of(run.events)
    assert [s for s, _ in epochs] == [1, 2]
    for _, metrics in epochs:
        assert set(metrics) == CLASSIFICATION_NAMES and metrics["samples_per_s"] > 0
    assert run.result.epochs_completed == 2
    assert run.result.export_format == "tf_saved_model"
    assert (Path(spec.export_dir) / "saved_model.pb").is_file()
    assert run.result.test_metrics["test_accuracy"] > 0.5, run.result.test_metrics


def assert_no_children_left(run: FreshRun, expected: int) -> None:
    assert len(run.children_at_start) == expected
    assert run.children_at_end == []
    assert not [pid for pid in run.children_at_start if alive(pid)]


def test_mirrored_over_two_logical_cpus(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, strategy="mirrored", world_size=2)
    run = run_fresh(spec, digits())
    assert_trained_two_epochs(run, spec)
    assert_no_children_left(run, expected=0)


def test_central_storage_over_two_logical_cpus(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, strategy="central_storage", world_size=2)
    run = run_fresh(spec, digits())
    assert_trained_two_epochs(run, spec)
    assert_no_children_left(run, expected=0)


def test_parameter_server_with_one_worker_and_one_ps(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, strategy="parameter_server", world_size=1, options={"ps": "1"})
    run = run_fresh(spec, digits())
    assert_trained_two_epochs(run, spec)
    assert_no_children_left(run, expected=2)


def test_multi_worker_mirrored_stops_every_worker_then_resumes_and_finishes(
    tmp_path: Path,
) -> None:
    data = digits()
    checkpoints = str(tmp_path / "ck")

    def spec(name: str) -> RunSpec:
        return make_spec(
            tmp_path / name,
            strategy="multi_worker_mirrored",
            world_size=2,
            epochs=3,
            checkpoint_dir=checkpoints,
        )

    stopped = run_fresh(spec("a"), data, Recorder(stop_after=1))
    assert stopped.error == "", stopped.error
    assert stopped.result is not None
    assert stopped.result.stopped is StopReason.PRUNE
    assert stopped.result.epochs_completed == 1
    assert [s for s, _ in epochs_of(stopped.events)] == [1]
    assert not Path(spec("a").export_dir).exists()
    # The worker agreed to stop after the same epoch and left with the chief.
    assert_no_children_left(stopped, expected=1)

    # Resumed on both workers from the chief's checkpoint; epoch 2 ends with a
    # "go on" agreement, epoch 3 with the export.
    resumed = run_fresh(spec("b"), data)
    assert resumed.error == "", resumed.error
    assert [(k, s) for k, s, _ in resumed.events if k == "started"] == [("started", 1)]
    epochs = epochs_of(resumed.events)
    assert [s for s, _ in epochs] == [2, 3]
    for _, metrics in epochs:
        assert set(metrics) == CLASSIFICATION_NAMES and metrics["samples_per_s"] > 0
    assert resumed.result is not None
    assert resumed.result.epochs_completed == 3
    assert resumed.result.export_format == "tf_saved_model"
    assert resumed.result.test_metrics["test_accuracy"] > 0.5, resumed.result.test_metrics
    assert (Path(spec("b").export_dir) / "saved_model.pb").is_file()
    assert_no_children_left(resumed, expected=1)


def test_a_dead_worker_fails_the_multi_worker_run_instead_of_hanging(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, strategy="multi_worker_mirrored", world_size=2, epochs=3)
    run = run_fresh(spec, digits(), Recorder(kill_children_after=1))
    # The chief's next collective fails (the ring sees its peer go, or else the
    # cluster watch aborts it): a retryable machine fault, not a hang until the
    # trial times out.
    assert run.result is None
    assert run.error.startswith("UnavailableError"), run.error
    assert [s for s, _ in epochs_of(run.events)] == [1]
    assert_no_children_left(run, expected=1)


def test_a_multi_worker_cluster_tolerates_a_minute_without_a_heartbeat() -> None:
    # TensorFlow's own 10 s failed a healthy two-worker run on a loaded CI host.
    probe = textwrap.dedent(
        """
        import tensorflow as tf
        from tensorflow.python.eager import context
        from svc_trainer.backends.tensorflow import devices

        cluster = tf.train.ClusterSpec({"worker": ["127.0.0.1:1", "127.0.0.1:2"]})
        devices._coordinate(cluster)
        config = context.context().config.experimental.coordination_config
        print(config.service_leader, config.heartbeat_timeout_in_ms,
              [(j.name, j.num_tasks) for j in config.coordinated_job_list])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split("\n")[-2] == (
        f"/job:worker/replica:0/task:0 {devices.HEARTBEAT_TIMEOUT_MS} [('worker', 2)]"
    )
    assert devices.HEARTBEAT_TIMEOUT_MS >= 60_000
