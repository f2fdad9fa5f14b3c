"""The GPU check (`make gpu-check`): every PyTorch and TensorFlow strategy of
svc_trainer on this machine's GPUs, and the trainer's PyTorch path against a
plain loop, same run.

Data: MNIST-shaped (60,000 training and 10,000 test images of 28x28, 10
classes), written by this script as the four standard IDX files and read
back through the trainer's own MNIST loader: each class is a random pixel
template plus noise, so the models learn. Every strategy trains the default
CNN for 2 epochs at batch 1,024 (the global batch), each in a fresh process
(TensorFlow's devices and precision are per process). The table gives the
strategy, its devices, the last epoch's samples/s (the trainer's own
``samples_per_s``: training steps only, after the device finished them) and
ok, or failed with the reason.

Then ``trainer_vs_plain_gpu``: ``torch_runner``'s ``single`` strategy (data
resident on the GPU, bf16 autocast, its stop checks and loss bookkeeping)
against a plain loop over the same model, optimizer, autocast and data on
the GPU (index, forward, backward, step; nothing else), the second epoch of
each, measured the same way. Prints, higher better:

    trainer_vs_plain_gpu: ratio R (goal 0.95)

On a machine without a CUDA device it says so and exits 0 (``--allow-cpu``
runs everything on the CPU, smaller, to check the script itself; its figures
are not GPU figures).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench.harness import print_ratio

EPOCHS = 2
BATCH = 1024
TORCH_STRATEGIES = ("single", "ddp", "model_parallel")
TF_STRATEGIES = (
    "one_device",
    "mirrored",
    "central_storage",
    "multi_worker_mirrored",
    "parameter_server",
)
RUN_TIMEOUT_S = 900


def write_mnist_shaped(root: Path, train: int, test: int, seed: int = 0) -> Path:
    """The four MNIST IDX files of learnable synthetic digits in ``root``."""
    import numpy as np

    from svc_trainer.data.datasets import MNIST_FILES
    from svc_trainer.data.idx import write_idx

    rng = np.random.default_rng(seed)
    templates = (rng.random((10, 28, 28)) > 0.8).astype(np.float32) * 200.0

    def images(count: int) -> tuple[Any, Any]:
        labels = rng.integers(0, 10, size=count).astype(np.uint8)
        noise = rng.normal(0.0, 40.0, size=(count, 28, 28))
        pixels = np.clip(templates[labels] + noise, 0, 255).astype(np.uint8)
        return pixels, labels

    root.mkdir(parents=True, exist_ok=True)
    x_train, y_train = images(train)
    x_test, y_test = images(test)
    write_idx(root / MNIST_FILES["train_images"], x_train)
    write_idx(root / MNIST_FILES["train_labels"], y_train)
    write_idx(root / MNIST_FILES["test_images"], x_test)
    write_idx(root / MNIST_FILES["test_labels"], y_test)
    return root


def _spec(framework: str, strategy: str, work: Path, device: str) -> Any:
    from svc_trainer.plan import Hyperparams, RunSpec

    return RunSpec(
        trial_id=f"gpu-check/{strategy}",
        study_id="gpu-check",
        trial_number=0,
        attempt=1,
        dataset="mnist",
        model_family="cnn",
        framework=framework,
        strategy=strategy,
        world_size=0,
        epochs=EPOCHS,
        hparams=Hyperparams(batch_size=BATCH),
        seed=0,
        objective_metric="val_error",
        checkpoint_dir=str(work / "checkpoints"),
        export_dir=str(work / "export"),
        tensorboard_dir=str(work / "tensorboard"),
        device=device,
    )


class _LastEpoch:
    def __init__(self) -> None:
        self.samples_per_s = 0.0

    def started(self, resumed_from_step: int, note: str = "") -> None:
        pass

    def epoch(self, step: int, metrics: Any) -> None:
        self.samples_per_s = float(metrics["samples_per_s"])

    def stop_requested(self) -> Any:
        from svc_trainer.plan import StopReason

        return StopReason.NONE


def _devices(strategy: str, device: str) -> str:
    if device == "cpu":
        return "cpu"
    import torch

    gpus = torch.cuda.device_count()
    if strategy in ("ddp", "mirrored", "central_storage", "multi_worker_mirrored"):
        return f"{gpus} GPU"
    if strategy == "model_parallel":
        return f"{min(gpus, 2)} GPU"
    return "1 GPU"


def _run_one(framework: str, strategy: str, mnist: str, device: str, out: Any) -> None:
    """One strategy in this (fresh) process: (samples/s, "ok" or the failure)."""
    try:
        from svc_trainer.data import datasets

        data = datasets.load("mnist", {"path": mnist})
        with tempfile.TemporaryDirectory(prefix="aistack-gpu-check-") as scratch:
            spec = _spec(framework, strategy, Path(scratch), device)
            channel = _LastEpoch()
            if framework == "torch":
                from svc_trainer.backends.torch import runner as torch_runner

                torch_runner.run(spec, data, channel)
            else:
                from svc_trainer.backends.tensorflow import runner as tf_runner

                tf_runner.run(spec, data, channel)
        out.put((channel.samples_per_s, "ok"))
    except ImportError as exc:
        out.put((0.0, f"failed: {exc} (make setup GPU=1 installs tensorflow[and-cuda])"))
    except Exception as exc:
        traceback.print_exc()
        out.put((0.0, f"failed: {type(exc).__name__}: {str(exc)[:160]}"))


def run_strategy(framework: str, strategy: str, mnist: Path, device: str) -> tuple[float, str]:
    context = mp.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=_run_one, args=(framework, strategy, str(mnist), device, out))
    process.start()
    try:
        result: tuple[float, str] = out.get(timeout=RUN_TIMEOUT_S)
    except Exception:
        result = (0.0, f"failed: no result in {RUN_TIMEOUT_S} s (exit code {process.exitcode})")
    process.join(timeout=60)
    if process.is_alive():
        process.kill()
    return result


def _plain_loop(mnist: str, device_name: str, out: Any) -> None:
    """The peer: the same model and optimizer in a loop a user writes by hand,
    data resident on the device. Puts the second epoch's samples/s."""
    import torch
    from torch import nn

    from svc_trainer.backends.torch import models as torch_models
    from svc_trainer.data import datasets
    from svc_trainer.plan import Hyperparams

    data = datasets.load("mnist", {"path": mnist})
    device = torch.device(device_name)
    hp = Hyperparams(batch_size=BATCH)
    torch.manual_seed(0)
    model = torch_models.build("cnn", hp, data).to(device)
    optimizer = torch_models.optimizer(hp, model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    x = torch.as_tensor(data.x_train, device=device)
    y = torch.as_tensor(data.y_train, device=device)
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    rate = 0.0
    for _epoch in range(EPOCHS):
        started = time.perf_counter()
        order = torch.randperm(len(x), device=device)
        for begin in range(0, len(x), BATCH):
            index = order[begin : begin + BATCH]
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = loss_fn(model(x[index]), y[index])
            loss.backward()
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        rate = len(x) / (time.perf_counter() - started)
    out.put(rate)


def plain_loop(mnist: Path, device: str) -> float:
    context = mp.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=_plain_loop, args=(str(mnist), device, out))
    process.start()
    rate: float = out.get(timeout=RUN_TIMEOUT_S)
    process.join(timeout=60)
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--allow-cpu", action="store_true", help="no GPU: run on the CPU")
    parser.add_argument("--train", type=int, default=60_000, help="training images")
    args = parser.parse_args()

    import torch

    if torch.cuda.is_available():
        device, auto = "cuda", "auto"
        print(f"devices: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
    elif args.allow_cpu:
        device, auto = "cpu", "cpu"
        print("devices: CPU only (--allow-cpu): a check of the script, not GPU figures")
    else:
        print("trainer_gpu: no CUDA device on this machine; nothing to measure (exit 0)")
        return 0

    with tempfile.TemporaryDirectory(prefix="aistack-mnist-") as scratch:
        mnist = write_mnist_shaped(Path(scratch), args.train, args.train // 6)
        rows = []
        for framework, strategies in (("torch", TORCH_STRATEGIES), ("tensorflow", TF_STRATEGIES)):
            for strategy in strategies:
                rate, status = run_strategy(framework, strategy, mnist, auto)
                rows.append((framework, strategy, _devices(strategy, device), rate, status))
        print(f"{'framework':<11} {'strategy':<22} {'devices':<8} {'samples/s':>10}  result")
        for framework, strategy, devices, rate, status in rows:
            print(f"{framework:<11} {strategy:<22} {devices:<8} {rate:>10,.0f}  {status}")

        trainer = next(rate for fw, st, _, rate, _ in rows if (fw, st) == ("torch", "single"))
        plain = plain_loop(mnist, device)
    print(f"plain loop (data on the {device}, batch {BATCH}): {plain:,.0f} samples/s")
    print(f"trainer single (batch {BATCH}): {trainer:,.0f} samples/s")
    label = (
        "trainer_vs_plain_gpu" if device == "cuda" else "trainer_vs_plain_cpu (not a GPU figure)"
    )
    print_ratio(label, trainer / plain, 0.95)
    return 0


if __name__ == "__main__":
    sys.exit(main())
