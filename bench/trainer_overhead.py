"""svc_trainer's training paths against plain framework code, same model,
data and epochs, measured in the same run.

Data: scikit-learn's digits training split repeated 8 times with a little
noise (8,600 images of 8x8), the default CNN (the "default configuration"),
batch size 128, 6 epochs. Each measurement runs in a fresh process (thread
settings are per process), twice, alternating; the better run counts.

Throughput is steady state: the training samples of one epoch over the
median time from one epoch's end to the next (the first epoch, with
start-up and tracing, left out). For the trainer's paths that time holds
everything they do per epoch: training, validation, the checkpoint, the
report and the stop checks; the peers only train.

1. ``torch_vs_plain``: the trainer's PyTorch path (``torch_runner.train``,
   single device) against a hand-written loop (same model, optimizer,
   batches; nothing else).
2. ``ddp_vs_threads``: DDP over 2 processes with 1 thread each against one
   process with 2 threads (both the trainer's path).
3. ``tf_vs_fit``: the trainer's TensorFlow path (``tf_runner.train``, one
   device) against a plain ``model.fit`` on the same Keras model.

Prints, higher always better:

    torch_vs_plain: ratio R (goal 0.95)
    ddp_vs_threads: ratio R (goal 0.85)
    tf_vs_fit: ratio R (goal 0.95)

Needs no broker.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from bench import profiling
from bench.harness import in_fresh_process, print_ratio, round_order

EPOCHS = 6
BATCH = 128


def bench_data() -> Any:
    import numpy as np

    from svc_trainer.data import datasets

    base = datasets.load("digits", {})
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [base.x_train + rng.normal(0, 0.02, base.x_train.shape) for _ in range(8)]
    ).astype(np.float32)
    y = np.concatenate([base.y_train] * 8)
    return replace(base, x_train=x, y_train=y)


def spec(tmp: str, **overrides: Any) -> Any:
    from svc_trainer.plan import Hyperparams, RunSpec

    values: dict[str, Any] = {
        "trial_id": "bench/0",
        "study_id": "bench",
        "trial_number": 0,
        "attempt": 1,
        "dataset": "digits",
        "model_family": "cnn",
        "framework": "torch",
        "strategy": "single",
        "world_size": 0,
        "epochs": EPOCHS,
        "hparams": Hyperparams(batch_size=BATCH),
        "seed": 1,
        "objective_metric": "val_error",
        "checkpoint_dir": f"{tmp}/checkpoints",
        "export_dir": f"{tmp}/export",
        "tensorboard_dir": f"{tmp}/tb",
        "device": "cpu",
        "threads": 2,
    }
    values.update(overrides)
    return RunSpec(**values)


def steady(samples: int, epoch_ends: list[float]) -> float:
    """Samples per second from the median epoch-to-epoch interval."""
    gaps = [b - a for a, b in itertools.pairwise(epoch_ends)]
    return samples / statistics.median(gaps)


class Quiet:
    """A channel that notes when each epoch's report arrives."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def started(self, resumed_from_step: int, note: str = "") -> None:
        pass

    def epoch(self, step: int, metrics: Mapping[str, float]) -> None:
        self.ends.append(time.perf_counter())

    def stop_requested(self) -> Any:
        from svc_trainer.plan import StopReason

        return StopReason.NONE


# ---- the measurements (each in its own process) ----


def torch_trainer(threads: int, strategy: str, world: int) -> dict[str, float]:
    import torch

    from svc_trainer.backends.torch import runner as torch_runner

    torch.set_num_threads(threads)
    data = bench_data()
    channel = Quiet()
    with tempfile.TemporaryDirectory() as tmp:
        run = spec(tmp, strategy=strategy, world_size=world, threads=threads)
        torch_runner.train(run, data, channel)
    return {"samples_per_s": steady(len(data.x_train), channel.ends)}


def torch_plain() -> dict[str, float]:
    import torch
    from torch import nn

    from svc_trainer.backends.torch import models as torch_models
    from svc_trainer.plan import Hyperparams

    torch.set_num_threads(2)
    torch.manual_seed(1)
    data = bench_data()
    hp = Hyperparams(batch_size=BATCH)
    model = torch_models.build("cnn", hp, data)
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.learning_rate)
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.as_tensor(data.x_train), torch.as_tensor(data.y_train)
    ends = []
    for _ in range(EPOCHS):
        model.train()
        order = torch.randperm(len(x))
        for start in range(0, len(x), BATCH):
            index = order[start : start + BATCH]
            optimizer.zero_grad()
            loss = loss_fn(model(x[index]), y[index])
            loss.backward()
            optimizer.step()
        ends.append(time.perf_counter())
    return {"samples_per_s": steady(len(x), ends)}


def tf_trainer() -> dict[str, float]:
    from svc_trainer.backends.tensorflow import runner as tf_runner

    data = bench_data()
    channel = Quiet()
    with tempfile.TemporaryDirectory() as tmp:
        run = spec(tmp, framework="tensorflow", strategy="one_device")
        tf_runner.train(run, data, channel)
    return {"samples_per_s": steady(len(data.x_train), channel.ends)}


def tf_plain() -> dict[str, float]:
    import tensorflow as tf

    from svc_trainer.backends.tensorflow import models as tf_models
    from svc_trainer.plan import Hyperparams

    tf.config.threading.set_intra_op_parallelism_threads(2)
    data = bench_data()
    hp = Hyperparams(batch_size=BATCH)
    tf.keras.utils.set_random_seed(1)
    model = tf_models.build_model("cnn", hp, data)
    tf_models.compile_model(model, hp, data.task)
    ends: list[float] = []
    mark = tf.keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: ends.append(time.perf_counter())
    )
    model.fit(
        data.x_train, data.y_train, batch_size=BATCH, epochs=EPOCHS, verbose=0, callbacks=[mark]
    )
    return {"samples_per_s": steady(len(data.x_train), ends)}


def best_of(rounds: int, *measurements: Callable[[], dict[str, float]]) -> list[dict[str, float]]:
    best: list[dict[str, float]] = [{} for _ in measurements]
    for round_number in range(rounds):
        for index in round_order(range(len(measurements)), round_number):
            result = measurements[index]()
            for key, value in result.items():
                best[index][key] = max(best[index].get(key, -math.inf), value)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    profiling.add_flag(parser, "trainer_overhead")
    args = parser.parse_args()

    trainer, plain = best_of(
        args.rounds,
        lambda: in_fresh_process(torch_trainer, 2, "single", 0),
        lambda: in_fresh_process(torch_plain),
    )
    print(f"torch trainer path: {trainer['samples_per_s']:,.0f} samples/s")
    print(f"torch plain loop: {plain['samples_per_s']:,.0f} samples/s")

    ddp, threads = best_of(
        args.rounds,
        lambda: in_fresh_process(torch_trainer, 1, "ddp", 2),
        lambda: in_fresh_process(torch_trainer, 2, "single", 0),
    )
    print(f"DDP 2 processes x 1 thread: {ddp['samples_per_s']:,.0f} samples/s")
    print(f"1 process x 2 threads: {threads['samples_per_s']:,.0f} samples/s")

    tf_path, fit = best_of(
        args.rounds, lambda: in_fresh_process(tf_trainer), lambda: in_fresh_process(tf_plain)
    )
    print(f"tensorflow trainer path: {tf_path['samples_per_s']:,.0f} samples/s")
    print(f"tensorflow model.fit: {fit['samples_per_s']:,.0f} samples/s")

    print_ratio("torch_vs_plain", trainer["samples_per_s"] / plain["samples_per_s"], 0.95)
    # Both sides are the trainer's own path: what DDP costs over threads.
    ratio = ddp["samples_per_s"] / threads["samples_per_s"]
    print_ratio("ddp_vs_threads", ratio, 0.85, itself=True)
    print_ratio("tf_vs_fit", tf_path["samples_per_s"] / fit["samples_per_s"], 0.95)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
