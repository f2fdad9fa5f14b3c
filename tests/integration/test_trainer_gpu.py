"""The trainers on NVIDIA GPUs: NCCL collectives on CUDA tensors, one rank per
GPU, the refusal of more ranks than GPUs, torchrun, bf16, a user's model and
a user's loop (the example project's) on the GPU, TensorFlow's strategies
over the GPUs.

Every test here needs a CUDA device and is skipped, with the reason, where
there is none (CI never has one); the CPU tests in test_trainer_torch.py and
test_trainer_tf.py prove the same code paths under gloo and on logical CPUs.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aistack.studies import ship_code
from shared.artifacts import TORCH_EXPORT_FILE
from svc_trainer.backends.torch import devices as torch_devices
from svc_trainer.backends.torch import runner as torch_runner
from svc_trainer.plan import CodeRef, Hyperparams, StopReason, TrialError
from tests.integration import torch_group
from tests.integration.trainer_support import RecordingChannel, digits_splits, run_spec

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(
    GPUS == 0, reason="no CUDA device here: the GPU tests run on a machine with one"
)
two_gpus = pytest.mark.skipif(0 < GPUS < 2, reason=f"needs 2 GPUs, this machine has {GPUS}")
DIGITS = digits_splits()
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "user_project"


def test_single_trains_in_bf16_on_the_gpu_with_its_data_resident_and_exports(
    tmp_path: Path,
) -> None:
    channel = RecordingChannel()
    spec = run_spec(tmp_path, device="cuda", epochs=3, hparams=Hyperparams())
    result = torch_runner.run(spec, DIGITS, channel)
    assert result.test_metrics["test_accuracy"] > 0.9, result.test_metrics
    assert (tmp_path / "export" / TORCH_EXPORT_FILE).is_file()
    assert torch_devices.data_placement(
        DIGITS.x_train.nbytes, torch.device("cuda", 0), 1 << 30
    ) == ("device")


def test_ddp_runs_one_rank_per_gpu_over_nccl(tmp_path: Path) -> None:
    channel = RecordingChannel()
    spec = run_spec(tmp_path, strategy="ddp", world_size=GPUS, device="cuda", epochs=2)
    result = torch_runner.run(spec, DIGITS, channel)
    assert len(result.replica_digests) == GPUS
    assert len(set(result.replica_digests)) == 1
    assert [step for step, _ in channel.epochs()] == [1, 2]


def test_ddp_ranks_on_gpus_stop_together(tmp_path: Path) -> None:
    channel = RecordingChannel(stop_after=1)
    spec = run_spec(tmp_path, strategy="ddp", world_size=GPUS, device="cuda", epochs=4)
    result = torch_runner.run(spec, DIGITS, channel)
    assert result.stopped is StopReason.PRUNE and result.epochs_completed == 1


def test_more_ranks_than_gpus_fails_before_any_rank_starts(tmp_path: Path) -> None:
    spec = run_spec(tmp_path, strategy="ddp", world_size=GPUS + 1, device="cuda")
    with pytest.raises(TrialError, match=f"world_size {GPUS + 1} .* {GPUS} GPU") as refused:
        torch_runner.run(spec, DIGITS, RecordingChannel())
    assert refused.value.reason == "invalid_params"


@two_gpus
def test_the_group_reduces_cuda_tensors_under_nccl() -> None:
    mine, theirs = torch_group.reduce_over_two_ranks(cuda=True)
    assert mine == (int(StopReason.PRUNE), [4.0, 6.0], "cuda:0")
    assert theirs == (int(StopReason.PRUNE), [4.0, 6.0], "cuda:1")


@two_gpus
def test_model_parallel_puts_a_stage_on_each_of_two_gpus(tmp_path: Path) -> None:
    result = torch_runner.run(
        run_spec(tmp_path, strategy="model_parallel", device="cuda"), DIGITS, RecordingChannel()
    )
    assert result.epochs_completed == 2


def test_torchrun_runs_one_rank_per_gpu(tmp_path: Path) -> None:
    from google.protobuf import json_format

    from tests.integration.trainer_service import trial_request

    trial = tmp_path / "trial.json"
    trial.write_text(json_format.MessageToJson(trial_request("gpu", 0, strategy="ddp", epochs=2)))
    launched = subprocess.run(
        [
            str(Path(sys.executable).with_name("torchrun")),
            "--standalone",
            "--nproc-per-node",
            str(GPUS),
            "-m",
            "svc_trainer.backends.torch.torchrun",
            str(trial),
            "--out",
            str(tmp_path / "out"),
            "--device",
            "cuda",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    lines = [json.loads(line) for line in launched.stdout.splitlines() if line.startswith("{")]
    done = lines[-1]
    assert done["event"] == "completed" and done["epochs"] == 2
    assert len(set(done["replica_digests"])) == 1


@pytest.fixture(scope="module")
def example_code(tmp_path_factory: pytest.TempPathFactory) -> CodeRef:
    """The example project's PyTorch half, shipped as a study ships it: its
    requirements name keras too, which a GPU machine with PyTorch alone
    lacks (and the trainer rightly refuses the package there)."""
    root = tmp_path_factory.mktemp("shipped")
    project = root / "project"
    shutil.copytree(
        EXAMPLE / "mymodels", project / "mymodels", ignore=shutil.ignore_patterns("__pycache__")
    )
    (project / "requirements.txt").write_text("torch>=2.0\nscikit-learn>=1.3\n")
    package = ship_code(project, str(root / "store"))
    return CodeRef(package.uri, package.sha256, str(root / "code" / package.sha256))


@pytest.mark.parametrize(
    ("kind", "target", "strategy"),
    [
        ("model", "mymodels.torch_model:build", "single"),
        ("entrypoint", "mymodels.train_loop:train", "ddp"),
    ],
)
def test_a_users_model_and_a_users_loop_train_on_the_gpu_and_export(
    tmp_path: Path, example_code: CodeRef, kind: str, target: str, strategy: str
) -> None:
    # The example's model takes a table: the digits' 64 pixels as columns.
    table = dataclasses.replace(
        DIGITS,
        x_train=DIGITS.x_train.reshape(len(DIGITS.x_train), -1),
        x_val=DIGITS.x_val.reshape(len(DIGITS.x_val), -1),
        x_test=DIGITS.x_test.reshape(len(DIGITS.x_test), -1),
    )
    channel = RecordingChannel()
    spec = run_spec(
        tmp_path,
        device="cuda",
        strategy=strategy,
        world_size=GPUS if strategy == "ddp" else 0,
        epochs=4,
        model_family="",
        code=example_code,
        params={"lr": 0.01},
        **{kind: target},
    )
    result = torch_runner.run(spec, table, channel)
    assert [step for step, _ in channel.epochs()] == [1, 2, 3, 4]
    assert result.val_metrics["val_error"] < 0.3, result.val_metrics  # chance: 0.9
    assert (tmp_path / "export" / TORCH_EXPORT_FILE).is_file()


# -- TensorFlow: needs tensorflow[and-cuda] (make setup GPU=1) -----------------------------


def _tensorflow_gpus() -> int:
    """GPUs TensorFlow sees, asked in a child (importing TensorFlow here would
    load its runtime into the test process)."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return int(probe.stdout.strip() or 0) if probe.returncode == 0 else 0


@pytest.fixture(scope="module")
def tf_gpus() -> int:
    seen = _tensorflow_gpus()
    if seen == 0:
        pytest.skip(
            "TensorFlow sees no GPU (not installed, or tensorflow-cpu: make setup GPU=1 "
            "installs tensorflow[and-cuda])"
        )
    return seen


@pytest.mark.parametrize(
    "strategy", ["one_device", "mirrored", "central_storage", "multi_worker_mirrored"]
)
def test_tensorflow_strategies_train_on_the_gpus(
    tmp_path: Path, tf_gpus: int, strategy: str
) -> None:
    from tests.integration.test_trainer_tf import assert_trained_two_epochs, make_spec, run_fresh

    spec = make_spec(tmp_path, strategy=strategy, device="cuda")
    run = run_fresh(spec, DIGITS)
    assert_trained_two_epochs(run, spec)


def test_tensorflow_refuses_more_workers_than_gpus(tmp_path: Path, tf_gpus: int) -> None:
    from tests.integration.test_trainer_tf import make_spec, run_fresh

    spec = make_spec(
        tmp_path, strategy="multi_worker_mirrored", world_size=tf_gpus + 1, device="cuda"
    )
    run = run_fresh(spec, DIGITS)
    assert f"world_size {tf_gpus + 1} on this node" in run.error and run.result is None
