"""From trial requests to runs and from runs to model-ready events; the
trainer's parameters, settings and TensorBoard records. No broker."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from google.protobuf import json_format

from shared.artifacts import ArtifactStore, digest
from shared.contracts.aistack.v1 import common_pb2, models_pb2, tuning_pb2
from shared.distribution import training_distribution
from shared.errors import ConfigError
from shared.objective import BASELINE_VERSION, VERSION_OFFSET
from shared.settings import load_settings
from svc_trainer import trials
from svc_trainer.plan import DataLoaded, Hyperparams, RunResult, TensorSig, TrialError
from svc_trainer.settings import TrainerSettings


def request(**task: object) -> tuning_pb2.TrialRequested:
    made = tuning_pb2.TrialRequested(
        trial_id="study-a/4",
        study_id="study-a",
        trial_number=4,
        attempt=2,
        task=tuning_pb2.TrainingTask(
            dataset="digits", framework=common_pb2.FRAMEWORK_TORCH, epochs=3, **task
        ),
        objective=common_pb2.Objective(metric="val_error", direction=common_pb2.DIRECTION_MINIMIZE),
        seed=9,
    )
    made.params["learning_rate"].float_value = 0.01
    made.params["units"].int_value = 64
    made.params["activation"].string_value = "tanh"
    return made


def spec_of(made: tuning_pb2.TrialRequested, tmp: Path) -> object:
    return trials.run_spec(
        made,
        checkpoint_dir=tmp / "c",
        export_dir=tmp / "e",
        tensorboard_dir=tmp / "t",
        device="cpu",
        threads=0,
        world_size=2,
    )


def test_a_request_becomes_a_run(tmp_path: Path) -> None:
    spec = trials.run_spec(
        request(strategy="ddp"),
        checkpoint_dir=tmp_path / "c",
        export_dir=tmp_path / "e",
        tensorboard_dir=tmp_path / "t",
        device="cpu",
        threads=1,
        world_size=2,
    )
    assert spec.framework == "torch" and spec.strategy == "ddp" and spec.world_size == 2
    assert spec.model_family == "cnn" and spec.epochs == 3 and spec.seed == 9
    assert spec.hparams == Hyperparams(learning_rate=0.01, units=64, activation="tanh")
    assert spec.objective_metric == "val_error" and spec.attempt == 2
    assert trials.model_name(request()) == "study-a" and trials.model_version(request()) == "5"
    assert trials.model_name(request(model_name="digits")) == "digits"
    assert trials.trial_key(request()) == "study-a/4"


def test_a_version_offset_puts_a_retunes_versions_after_the_loops_earlier_ones(
    tmp_path: Path,
) -> None:
    offset = request(options={VERSION_OFFSET: "12"})
    assert trials.model_version(offset) == "17"  # 12 + trial number 4 + 1
    bad = request(options={VERSION_OFFSET: "-3"})
    with pytest.raises(TrialError, match="model_version_offset") as caught:
        spec_of(bad, tmp_path)
    assert caught.value.reason == "invalid_params"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda r: setattr(r.task, "framework", 0), "unknown_framework"),
        (lambda r: setattr(r.task, "dataset", ""), "unknown_dataset"),
        (lambda r: setattr(r.task, "epochs", 0), "invalid_params"),
        (lambda r: r.params["dropout"].__setattr__("float_value", 1.5), "invalid_params"),
        (lambda r: r.params["units"].__setattr__("float_value", 2.5), "invalid_params"),
        (lambda r: r.params["optimizer"].__setattr__("string_value", "lion"), "invalid_params"),
        (lambda r: r.params["kernel_width"].__setattr__("int_value", 4), "invalid_params"),
        (lambda r: r.params["mystery"].__setattr__("int_value", 1), "invalid_params"),
        (lambda r: r.objective.__setattr__("metric", ""), "unknown_metric"),
    ],
)
def test_what_no_trainer_can_train_is_a_trial_error(
    tmp_path: Path, change: object, reason: str
) -> None:
    made = request()
    change(made)  # type: ignore[operator]
    with pytest.raises(TrialError) as refused:
        spec_of(made, tmp_path)
    assert refused.value.reason == reason


def test_an_integral_float_is_accepted_for_an_int_parameter() -> None:
    assert Hyperparams.from_params({"units": 64.0}).units == 64


def test_the_model_ready_event_carries_metrics_and_lineage(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.pt2").write_bytes(b"weights")
    sha, size = digest(tmp_path / "model")
    result = RunResult(
        epochs_completed=3,
        val_metrics={"val_error": 0.02, "val_accuracy": 0.98},
        test_metrics={"test_error": 0.03},
        export_format="torch_export",
        inputs=(TensorSig("input", "FP32", (-1, 8, 8)),),
        outputs=(TensorSig("probabilities", "FP32", (-1, 10)),),
    )
    data = DataLoaded(
        "digits",
        "abc123",
        "sklearn digits",
        (("aistack.features.windows", 0, 42),),
        files=("/store/date=x/part-0.parquet",),
    )
    ready = trials.model_ready(
        request(),
        result,
        data,
        artifact_uri="file:///x",
        sha256=sha,
        size_bytes=size,
        trainer_id="t1",
    )
    assert (ready.model_name, ready.version) == ("study-a", "5")
    assert ready.format == models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT
    assert ready.framework == common_pb2.FRAMEWORK_TORCH
    assert dict(ready.metrics) == {"val_error": 0.02, "val_accuracy": 0.98, "test_error": 0.03}
    assert ready.objective.metric == "val_error"
    assert [(t.name, list(t.shape)) for t in ready.inputs] == [("input", [-1, 8, 8])]
    assert ready.lineage.params["units"].int_value == 64
    assert ready.lineage.data.dataset == "digits@abc123"
    assert ready.lineage.data.offsets[0].offset == 42
    assert list(ready.lineage.data.files) == ["/store/date=x/part-0.parquet"]
    assert ready.labels["trainer"] == "t1" and ready.labels["attempt"] == "2"
    assert ready.sha256 == sha and ready.size_bytes == len(b"weights")


def test_nan_metrics_stay_off_the_wire() -> None:
    assert trials.progress_metrics({"a": 1.0, "b": math.nan, "c": math.inf}) == {"a": 1.0}


def test_a_directory_digest_ignores_where_and_when(tmp_path: Path) -> None:
    for name in ("one", "two"):
        root = tmp_path / name
        (root / "variables").mkdir(parents=True)
        (root / "variables" / "data").write_bytes(b"\x00\x01")
        (root / "saved_model.pb").write_bytes(b"graph")
    (tmp_path / "two" / "saved_model.pb").touch()  # another mtime
    assert digest(tmp_path / "one") == digest(tmp_path / "two")
    (tmp_path / "two" / "saved_model.pb").write_bytes(b"graph!")
    assert digest(tmp_path / "one")[0] != digest(tmp_path / "two")[0]


def test_the_artifact_store_on_another_filesystem(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "state").write_bytes(b"epoch 3")
    store = ArtifactStore(f"memory://aistack-{tmp_path.name}")
    assert not store.local
    uri = store.put_dir(tmp_path / "ckpt", "checkpoints/s/1")
    assert uri.startswith("memory://") and store.exists("checkpoints/s/1")
    assert store.get_dir("checkpoints/s/1", tmp_path / "back")
    assert (tmp_path / "back" / "state").read_bytes() == b"epoch 3"
    assert not store.get_dir("checkpoints/none", tmp_path / "nothing")


def test_a_remote_checkpoint_is_replaced_only_by_a_whole_one(tmp_path: Path) -> None:
    store = ArtifactStore(f"memory://aistack-{tmp_path.name}")
    assert not store.get_checkpoint("checkpoints/s/1", tmp_path / "none")
    (tmp_path / "ckpt").mkdir()
    for epoch in (1, 2):
        (tmp_path / "ckpt" / "state").write_bytes(f"epoch {epoch}".encode())
        store.put_checkpoint(tmp_path / "ckpt", "checkpoints/s/1")
    assert store.get_checkpoint("checkpoints/s/1", tmp_path / "back")
    assert (tmp_path / "back" / "state").read_bytes() == b"epoch 2"
    # Only the current version and its pointer stay.
    assert len(store._fs.ls(store.path("checkpoints/s/1"))) == 2

    # An upload killed half-way leaves a version nobody points at: ignored.
    store._fs.pipe_file(store.path("checkpoints/s/1/v99999999999999999999/state"), b"half")
    assert store.get_checkpoint("checkpoints/s/1", tmp_path / "after-kill")
    assert (tmp_path / "after-kill" / "state").read_bytes() == b"epoch 2"
    # ... and the next whole upload clears it away.
    (tmp_path / "ckpt" / "state").write_bytes(b"epoch 3")
    store.put_checkpoint(tmp_path / "ckpt", "checkpoints/s/1")
    assert len(store._fs.ls(store.path("checkpoints/s/1"))) == 2
    assert store.get_checkpoint("checkpoints/s/1", tmp_path / "back")
    assert (tmp_path / "back" / "state").read_bytes() == b"epoch 3"


def test_a_checkpoint_replaced_while_being_read_is_read_again_from_the_pointer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer puts a new version, moves the pointer and removes the old one
    between a reader's read of the pointer and its copy (measured in CI: FTP
    answered 550 for the removed version)."""
    store = ArtifactStore(f"memory://aistack-{tmp_path.name}")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "state").write_bytes(b"epoch 1")
    store.put_checkpoint(tmp_path / "ckpt", "checkpoints/s/1")
    copy = store.get_dir
    raced: list[str] = []

    def copy_after_a_writer(key: str, local: Path) -> bool:
        if not raced:
            raced.append(key)
            (tmp_path / "ckpt" / "state").write_bytes(b"epoch 2")
            store.put_checkpoint(tmp_path / "ckpt", "checkpoints/s/1")
        return copy(key, local)

    monkeypatch.setattr(store, "get_dir", copy_after_a_writer)
    assert store.get_checkpoint("checkpoints/s/1", tmp_path / "back")
    assert (tmp_path / "back" / "state").read_bytes() == b"epoch 2"
    assert raced

    def broken(key: str, local: Path) -> bool:
        raise OSError("the store is down")

    # With the pointer unmoved, a failed copy is the store's failure.
    monkeypatch.setattr(store, "get_dir", broken)
    with pytest.raises(OSError, match="down"):
        store.get_checkpoint("checkpoints/s/1", tmp_path / "again")


def test_a_local_checkpoint_is_a_plain_directory(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "state").write_bytes(b"epoch 1")
    store.put_checkpoint(tmp_path / "ckpt", "checkpoints/s/1")
    assert (tmp_path / "store" / "checkpoints" / "s" / "1" / "state").read_bytes() == b"epoch 1"
    assert store.get_checkpoint("checkpoints/s/1", tmp_path / "back")
    assert (tmp_path / "back" / "state").read_bytes() == b"epoch 1"


def test_bad_trainer_settings_stop_start_up_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AISTACK_TRAINER_TF_CONFIG", "{not json")
    with pytest.raises(ConfigError, match="AISTACK_TRAINER_TF_CONFIG"):
        load_settings(TrainerSettings)
    monkeypatch.delenv("AISTACK_TRAINER_TF_CONFIG")
    monkeypatch.setenv("AISTACK_TRAINER_DEVICE", "tpu")
    with pytest.raises(ConfigError, match="AISTACK_TRAINER_DEVICE"):
        load_settings(TrainerSettings)
    monkeypatch.delenv("AISTACK_TRAINER_DEVICE")
    monkeypatch.setenv("AISTACK_TRAINER_RUNNERS", '{"jax": "no colon here"}')
    with pytest.raises(ConfigError, match=r"AISTACK_TRAINER_RUNNERS.*module:attribute"):
        load_settings(TrainerSettings)
    monkeypatch.delenv("AISTACK_TRAINER_RUNNERS")
    monkeypatch.setenv("AISTACK_TRAINER_WARM_FRAMEWORKS", "torch,jax")
    with pytest.raises(ConfigError, match="AISTACK_TRAINER_WARM_FRAMEWORKS names jax"):
        load_settings(TrainerSettings)


def test_a_runner_is_loaded_by_path_and_must_be_a_runner() -> None:
    from svc_trainer import runners

    assert runners.load("tests.integration.faulty_runner:RUNNER").name == "faulty"
    with pytest.raises(TrialError, match="not a Runner"):
        runners.load("svc_trainer.plan:Hyperparams")
    with pytest.raises(TrialError, match="cannot be loaded"):
        runners.load("no_such_module_here:RUNNER")
    assert runners.registry({"jax": "x:Y"}) == {**runners.BUILT_IN, "jax": "x:Y"}


def test_tensorboard_gets_hparams_and_scalars(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from svc_trainer.tensorboard import TrialBoard

    board = TrialBoard(
        tmp_path, "s/1", {"learning_rate": 0.01, "activation": "relu"}, ("loss", "val_error")
    )
    board.epoch(1, {"loss": 0.5, "val_error": 0.2, "skipped": math.nan})
    board.epoch(2, {"loss": 0.3, "val_error": 0.1})
    board.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.value for e in events.Scalars("val_error")] == pytest.approx([0.2, 0.1])
    assert "skipped" not in events.Tags()["scalars"]
    plugin = events.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in plugin and "_hparams_/experiment" in plugin


def test_the_worker_writes_tensorboard_runs_without_importing_tensorflow(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = (
        "import sys, pathlib\n"
        "from svc_trainer.tensorboard import TrialBoard\n"
        f"board = TrialBoard(pathlib.Path({str(tmp_path)!r}), 's/1', {{'lr': 0.1}}, ('loss',))\n"
        "board.epoch(1, {'loss': 0.5})\n"
        "board.close()\n"
        "print('tensorflow' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_a_framework_parameter_overrides_the_tasks_framework() -> None:
    chosen = request()
    chosen.params["framework"].string_value = "tensorflow"
    spec = trials.run_spec(
        chosen,
        checkpoint_dir=Path("/c"),
        export_dir=Path("/e"),
        tensorboard_dir=Path("/t"),
        device="cpu",
        threads=0,
        world_size=0,
    )
    assert spec.framework == "tensorflow"
    assert trials.framework_name(chosen) == "tensorflow"
    assert trials.framework_enum(chosen) == common_pb2.FRAMEWORK_TENSORFLOW
    unknown = request()
    unknown.params["framework"].string_value = "jax"
    with pytest.raises(TrialError) as refused:
        trials.run_spec(
            unknown,
            checkpoint_dir=Path("/c"),
            export_dir=Path("/e"),
            tensorboard_dir=Path("/t"),
            device="cpu",
            threads=0,
            world_size=0,
        )
    assert refused.value.reason == "unknown_framework"


def test_a_cv_fold_parameter_becomes_the_runs_fold_not_a_hyperparameter() -> None:
    folded = request()
    folded.task.options["cv_folds"] = "10"
    folded.params["cv_fold"].int_value = 3
    spec = trials.run_spec(
        folded,
        checkpoint_dir=Path("/c"),
        export_dir=Path("/e"),
        tensorboard_dir=Path("/t"),
        device="cpu",
        threads=0,
        world_size=0,
    )
    assert spec.options["cv_fold"] == "3" and spec.options["cv_folds"] == "10"
    assert spec.hparams == trials.Hyperparams.from_params(
        {k: v for k, v in trials.params(folded).items() if k != "cv_fold"}
    )


def test_a_plugin_framework_is_known_only_where_its_runner_is_registered() -> None:
    chosen = request()
    chosen.params["framework"].string_value = "jax"
    spec = trials.run_spec(
        chosen,
        checkpoint_dir=Path("/c"),
        export_dir=Path("/e"),
        tensorboard_dir=Path("/t"),
        device="cpu",
        threads=0,
        world_size=0,
        frameworks=("torch", "tensorflow", "jax"),
    )
    assert spec.framework == "jax"


def baseline_event() -> models_pb2.ModelReady:
    return models_pb2.ModelReady(
        model_name="forecast",
        version="3",
        format=models_pb2.ARTIFACT_FORMAT_TORCH_EXPORT,
        artifact_uri="file:///models/forecast/3",
        sha256="ab" * 32,
        inputs=[models_pb2.TensorSpec(name="input", datatype="FP32", shape=[-1, 7])],
        metrics={"val_mae": 0.25},
    )


def test_a_tasks_baseline_travels_in_the_run_spec_as_text(tmp_path: Path) -> None:
    measured = request(baseline=baseline_event())
    spec = trials.run_spec(
        measured,
        checkpoint_dir=tmp_path / "c",
        export_dir=tmp_path / "e",
        tensorboard_dir=tmp_path / "t",
        device="cpu",
        threads=0,
        world_size=0,
        baseline_dir=tmp_path / "baselines",
    )
    assert json_format.Parse(spec.baseline, models_pb2.ModelReady()) == baseline_event()
    assert spec.baseline_dir == str(tmp_path / "baselines")
    # A spec is JSON for TensorFlow's workers: the baseline must not break that.
    json.dumps(dataclasses.asdict(dataclasses.replace(spec, spark=None)))
    plain = spec_of(request(), tmp_path)
    assert (plain.baseline, plain.baseline_dir) == ("", "")  # type: ignore[attr-defined]


def test_the_model_ready_event_names_its_baseline_and_training_distribution() -> None:
    distribution = training_distribution(
        feature="temperature@tumbling-60s",
        metric="temperature",
        window="tumbling-60s",
        statistics={"mean": [1.0, 2.0, 3.0], "stddev": [0.5, 0.5, 0.5]},
        first_window_start_us=1_000_000,
        last_window_start_us=3_000_000,
    )
    data = DataLoaded(
        "features",
        "v1",
        "/store",
        (),
        feature="temperature@tumbling-60s",
        distribution=json_format.MessageToJson(distribution, indent=None),
    )
    result = RunResult(
        epochs_completed=1,
        val_metrics={"val_mae": 0.2, "baseline_val_mae": 0.3},
        export_format="torch_export",
    )
    measured = request(baseline=baseline_event())
    ready = trials.model_ready(
        measured, result, data, artifact_uri="file:///x", sha256="s", size_bytes=1, trainer_id="t"
    )
    assert ready.training_distribution == distribution
    assert ready.labels[BASELINE_VERSION] == "3"
    assert ready.metrics["baseline_val_mae"] == 0.3

    plain = trials.model_ready(
        request(),
        result,
        DataLoaded("digits", "v", "sklearn", ()),
        artifact_uri="file:///x",
        sha256="s",
        size_bytes=1,
        trainer_id="t",
    )
    assert not plain.HasField("training_distribution")
    assert BASELINE_VERSION not in plain.labels
