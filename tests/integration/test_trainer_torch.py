"""The PyTorch runner on real torch (CPU, gloo): strategies, DDP replicas in
sync, model parallel equal to one device, checkpoints, stopping, export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from shared.artifacts import TORCH_EXPORT_FILE
from svc_trainer.backends.torch import devices as torch_devices
from svc_trainer.backends.torch import loop as torch_loop
from svc_trainer.backends.torch import runner as torch_runner
from svc_trainer.plan import Hyperparams, StopReason, TrialError, check_replicas_fit
from tests.integration import torch_group
from tests.integration.trainer_support import (
    RecordingChannel,
    digits_splits,
    regression_splits,
    run_spec,
)

DIGITS = digits_splits()


def test_one_device_reports_every_epoch_and_exports(tmp_path: Path) -> None:
    channel = RecordingChannel()
    result = torch_runner.run(run_spec(tmp_path, epochs=2), DIGITS, channel)

    assert channel.started_events() == [(0, "")]
    epochs = channel.epochs()
    assert [step for step, _ in epochs] == [1, 2]
    for _, metrics in epochs:
        assert {"loss", "val_loss", "val_accuracy", "val_error", "samples_per_s"} <= set(metrics)
        assert metrics["samples_per_s"] > 0
        assert metrics["val_error"] == pytest.approx(1 - metrics["val_accuracy"])
    assert result.epochs_completed == 2 and result.stopped is StopReason.NONE
    assert set(result.test_metrics) == {"test_loss", "test_accuracy", "test_error"}
    assert result.export_format == "torch_export"
    assert [s.name for s in result.inputs] == ["input"]
    assert result.inputs[0].shape == (-1, 8, 8)
    assert result.outputs[0].name == "probabilities" and result.outputs[0].shape == (-1, 10)
    assert (tmp_path / "export" / TORCH_EXPORT_FILE).is_file()


def test_the_export_in_a_fresh_process_predicts_as_training_ended(tmp_path: Path) -> None:
    spec = run_spec(tmp_path, epochs=2)
    _, model = torch_runner.train(spec, DIGITS, RecordingChannel())
    path = torch_runner.export(model, DIGITS, Path(spec.export_dir))
    model.eval()
    with torch.no_grad():
        expected = torch.softmax(model(torch.as_tensor(DIGITS.x_test)), dim=-1).numpy()

    inputs, outputs = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(inputs, DIGITS.x_test[:7])  # another batch size than at export
    script = (
        "import sys, numpy as np, torch\n"
        "program = torch.export.load(sys.argv[1]).module()\n"
        "x = torch.as_tensor(np.load(sys.argv[2]))\n"
        "np.save(sys.argv[3], program(x).detach().numpy())\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path), str(inputs), str(outputs)], check=True)
    np.testing.assert_allclose(np.load(outputs), expected[:7], rtol=1e-5, atol=1e-6)


def test_the_default_configuration_reaches_97_percent_on_digits(tmp_path: Path) -> None:
    channel = RecordingChannel()
    spec = run_spec(tmp_path, epochs=10, hparams=Hyperparams())
    result = torch_runner.run(spec, DIGITS, channel)
    assert result.test_metrics["test_accuracy"] >= 0.97, result.test_metrics


def test_ddp_keeps_every_rank_identical(tmp_path: Path) -> None:
    channel = RecordingChannel()
    spec = run_spec(tmp_path, strategy="ddp", world_size=2, epochs=4)
    result = torch_runner.run(spec, DIGITS, channel)

    assert len(result.replica_digests) == 2
    assert result.replica_digests[0] == result.replica_digests[1]
    assert [step for step, _ in channel.epochs()] == [1, 2, 3, 4]  # only rank 0 reports
    # Each rank saw half of every epoch, and together they learned.
    assert result.test_metrics["test_accuracy"] > 0.6
    assert (tmp_path / "export" / TORCH_EXPORT_FILE).is_file()


@pytest.mark.timeout(120)
def test_ddp_trains_a_model_with_buffers(tmp_path: Path) -> None:
    # mlp standardises inside the model (buffers): rank 0 evaluating through
    # DDP's wrapper broadcast them to ranks that were not listening.
    channel = RecordingChannel()
    spec = run_spec(tmp_path, strategy="ddp", world_size=2, epochs=2, model_family="mlp")
    result = torch_runner.run(spec, DIGITS, channel)
    assert result.epochs_completed == 2 and len(set(result.replica_digests)) == 1
    assert [step for step, _ in channel.epochs()] == [1, 2]


def test_ddp_ranks_stop_together(tmp_path: Path) -> None:
    channel = RecordingChannel(stop_after=1)
    spec = run_spec(tmp_path, strategy="ddp", world_size=2, epochs=5)
    result = torch_runner.run(spec, DIGITS, channel)
    assert result.stopped is StopReason.PRUNE and result.epochs_completed == 1
    assert not (tmp_path / "export").exists()


def test_the_ranks_agree_and_sum_on_their_own_device_under_gloo() -> None:
    """The collectives DDP's stop checks and epoch totals use, over a real
    two-rank group; on GPUs the same code reduces CUDA tensors under NCCL
    (tests/integration/test_trainer_gpu.py)."""
    mine, theirs = torch_group.reduce_over_two_ranks(cuda=False)
    # Rank 1 asked to stop: both stop; the totals are the sums.
    assert mine == theirs == (int(StopReason.PRUNE), [4.0, 6.0], "cpu")


@pytest.mark.parametrize("strategy", ["ddp", "multi_worker_mirrored", "mirrored"])
def test_more_replicas_than_gpus_is_refused_naming_both(strategy: str) -> None:
    with pytest.raises(TrialError, match=rf"{strategy}: world_size 2 .* 1 GPU") as refused:
        check_replicas_fit(strategy, 2, gpus=1)
    assert refused.value.reason == "invalid_params"
    check_replicas_fit(strategy, 2, gpus=2)
    check_replicas_fit(strategy, 4, gpus=0)  # CPUs: as many ranks as asked


def test_training_data_goes_to_the_gpu_when_it_fits_else_pinned_memory() -> None:
    gpu = torch.device("cuda", 0)
    assert torch_devices.data_placement(1 << 20, gpu, free_bytes=1 << 30) == "device"
    assert torch_devices.data_placement(1 << 30, gpu, free_bytes=1 << 30) == "pinned"
    assert torch_devices.data_placement(1 << 30, torch.device("cpu"), free_bytes=0) == "host"


def test_model_parallel_computes_what_one_device_computes(tmp_path: Path) -> None:
    one = torch_runner.run(run_spec(tmp_path / "one", epochs=2), DIGITS, RecordingChannel())
    two_channel = RecordingChannel()
    two = torch_runner.run(
        run_spec(tmp_path / "two", strategy="model_parallel", epochs=2), DIGITS, two_channel
    )
    assert two.test_metrics == pytest.approx(one.test_metrics)
    assert [step for step, _ in two_channel.epochs()] == [1, 2]


def test_two_stages_cut_the_model_between_convolutions_and_head() -> None:
    from svc_trainer.backends.torch import models as torch_models

    model = torch_models.build("cnn", Hyperparams(), DIGITS)
    cut = torch_models.split_point(model)
    assert isinstance(model[cut - 1], torch.nn.Flatten)
    staged = torch_devices.TwoStage(model, cut, torch.device("cpu"), torch.device("cpu"))
    x = torch.as_tensor(DIGITS.x_val[:5])
    model.eval()
    assert torch.equal(staged(x), model(x))


def test_a_checkpoint_resumes_at_the_next_epoch(tmp_path: Path) -> None:
    torch_runner.run(run_spec(tmp_path, epochs=2), DIGITS, RecordingChannel())
    channel = RecordingChannel()
    result = torch_runner.run(run_spec(tmp_path, epochs=3), DIGITS, channel)
    assert channel.started_events() == [(2, "")]
    assert [step for step, _ in channel.epochs()] == [3]
    assert result.epochs_completed == 3


def test_a_corrupt_checkpoint_starts_over_and_says_so(tmp_path: Path) -> None:
    torch_runner.run(run_spec(tmp_path, epochs=1), DIGITS, RecordingChannel())
    (tmp_path / "checkpoints" / torch_loop.CHECKPOINT_FILE).write_bytes(b"not a checkpoint")
    channel = RecordingChannel()
    result = torch_runner.run(run_spec(tmp_path, epochs=2), DIGITS, channel)
    [(step, note)] = channel.started_events()
    assert step == 0 and "unreadable" in note and "starting over" in note
    assert [s for s, _ in channel.epochs()] == [1, 2] and result.epochs_completed == 2


def test_a_prune_stops_the_run_without_exporting(tmp_path: Path) -> None:
    channel = RecordingChannel(stop_after=1)
    result = torch_runner.run(run_spec(tmp_path, epochs=5), DIGITS, channel)
    assert result.stopped is StopReason.PRUNE and result.epochs_completed == 1
    assert "val_error" in result.val_metrics
    assert not (tmp_path / "export").exists()


def test_a_regression_mlp_on_raw_features(tmp_path: Path) -> None:
    data = regression_splits()
    hp = Hyperparams(units=32, dense_layers=2, learning_rate=1e-2, batch_size=32, dropout=0.0)
    spec = run_spec(tmp_path, model_family="mlp", epochs=15, hparams=hp, objective_metric="val_mae")
    channel = RecordingChannel()
    result = torch_runner.run(spec, data, channel)
    first, last = channel.epochs()[0][1], channel.epochs()[-1][1]
    assert last["val_mae"] < first["val_mae"]
    assert result.outputs[0].name == "prediction" and result.outputs[0].shape == (-1, 1)
    # Better than predicting the training mean.
    baseline = float(np.abs(data.y_test - data.y_train.mean()).mean())
    assert result.test_metrics["test_mae"] < baseline / 2


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"strategy": "horovod"}, "unknown_strategy"),
        ({"model_family": "transformer"}, "unknown_model"),
        ({"objective_metric": "val_bleu"}, "unknown_metric"),
    ],
)
def test_what_cannot_be_trained_is_refused_before_training(
    tmp_path: Path, overrides: dict[str, str], reason: str
) -> None:
    channel = RecordingChannel()
    with pytest.raises(TrialError) as refused:
        torch_runner.run(run_spec(tmp_path, **overrides), DIGITS, channel)
    assert refused.value.reason == reason
    assert channel.events == []


def test_a_cnn_on_features_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TrialError) as refused:
        torch_runner.run(run_spec(tmp_path), regression_splits(), RecordingChannel())
    assert refused.value.reason == "invalid_params"


def _torchrun(trial: Path, out: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            str(Path(sys.executable).with_name("torchrun")),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "svc_trainer.backends.torch.torchrun",
            str(trial),
            "--out",
            out,
            "--device",
            "cpu",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _events(lines: list[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_torchrun_checkpoints_to_a_remote_store_every_epoch_and_resumes_after_a_kill(
    tmp_path: Path,
) -> None:
    from google.protobuf import json_format

    from shared.artifacts import ArtifactStore, digest
    from tests.integration.ftp_store import ftp_store
    from tests.integration.trainer_service import trial_request

    trial = tmp_path / "trial.json"
    request = trial_request("launch", 0, strategy="ddp", epochs=4)
    trial.write_text(json_format.MessageToJson(request))
    with ftp_store(tmp_path / "ftp") as out:
        # The node dies (kill -9 of torchrun: its ranks go with it) once an
        # epoch has been reported.
        first = _torchrun(trial, out)
        assert first.stdout is not None
        seen: list[str] = []
        for line in first.stdout:
            seen.append(line)
            if '"event": "epoch"' in line:
                os.killpg(first.pid, signal.SIGKILL)
                break
        seen.extend(first.stdout)  # what it printed before the kill landed
        first.wait(timeout=60)
        printed = [e["step"] for e in _events(seen) if e["event"] == "epoch"]
        assert printed and printed[-1] != 4, f"the run was not killed mid-way: {seen}"

        second = _torchrun(trial, out)
        stdout, stderr = second.communicate(timeout=300)
        assert second.returncode == 0, stderr[-3000:]
        lines = _events(stdout.splitlines())
        resumed = lines[0]["resumed_from_step"]
        # A printed epoch was uploaded before it was printed; the kill may
        # have landed after one more upload.
        assert isinstance(resumed, int) and printed[-1] <= resumed <= printed[-1] + 1, lines[0]
        assert [e["step"] for e in lines if e["event"] == "epoch"] == list(range(resumed + 1, 5))
        done = lines[-1]
        assert done["event"] == "completed" and done["epochs"] == 4
        digests = done["replica_digests"]
        assert isinstance(digests, list) and len(digests) == 2 and digests[0] == digests[1]
        assert str(done["model_uri"]).startswith(out)
        model = tmp_path / "model"
        assert ArtifactStore(out).get_dir("model", model)
        assert (model / TORCH_EXPORT_FILE).is_file()
        assert digest(model)[0] == done["sha256"]
