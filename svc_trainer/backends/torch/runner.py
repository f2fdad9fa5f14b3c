"""svc_trainer's PyTorch runner: one device, DDP, and two-stage model parallel.

``run(spec, data, channel)`` follows the contract in ``plan``. The strategies:

- ``single`` (also ``one_device``): one process, one device (the first GPU
  when there is one, else the CPU).
- ``ddp``: DistributedDataParallel over ``world_size`` processes on this node
  (default: one per GPU, else 2): NCCL on GPUs, one GPU per rank, gloo on
  CPUs; each rank reads its shard through a DistributedSampler. This process
  is rank 0, the only one that talks to the channel and writes checkpoints;
  the ranks agree on stopping through an all-reduce of a tensor on their own
  device (NCCL reduces CUDA tensors only), so they always stop at the same
  batch. More ranks than GPUs is refused before any rank starts
  (``plan.check_replicas_fit``). With ``task.options.launcher: spark`` the
  ranks run as Spark barrier tasks instead, through TorchDistributor
  (``backends.torch.spark``); the trial reports, checkpoints and exports the same.
- ``model_parallel``: the network's layers split over two devices (two GPUs
  when present, else two CPU stages), activations moved between them.

On a GPU the training split is copied to the device once when it fits (see
``devices.data_placement``), else batches travel from pinned host memory.

The model is a built-in family's or the user's (``task.model``): the same
loop trains either. A training loop of the user's (``task.entrypoint``)
replaces the loop instead, under ``single`` and ``ddp`` and every launcher
(``user_loop``).

This module composes the runner: ``strategy`` (names, checks),
``devices`` (devices, ``TwoStage``, mixed precision), ``loop``
(one process's loop and checkpoints), ``ddp`` (the ranks, started
through ``backends.launch``), ``user_loop``.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from shared.artifacts import TORCH_EXPORT_FILE
from svc_trainer.backends.torch import models as torch_models
from svc_trainer.backends.torch.ddp import ddp
from svc_trainer.backends.torch.devices import TwoStage, device_for, two_devices
from svc_trainer.backends.torch.loop import Loop
from svc_trainer.backends.torch.spark import ddp_on_spark
from svc_trainer.backends.torch.strategy import check, strategy_of
from svc_trainer.plan import (
    TASK_CLASSIFICATION,
    Channel,
    DataSplits,
    RunResult,
    RunSpec,
    StopReason,
)
from svc_trainer.user_code.packages import put_on_path


def run(spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
    put_on_path(spec.code)  # an executor of the package has it already
    if spec.entrypoint:
        from svc_trainer.backends.torch import user_loop

        if spec.threads > 0:
            torch.set_num_threads(spec.threads)
        return user_loop.run(spec, data, channel)
    result, model = train(spec, data, channel)
    if result.stopped is not StopReason.NONE or not spec.export:
        return result
    export(model, data, Path(spec.export_dir))
    inputs, outputs = torch_models.signature(data)
    return replace(result, export_format="torch_export", inputs=inputs, outputs=outputs)


def train(spec: RunSpec, data: DataSplits, channel: Channel) -> tuple[RunResult, nn.Module]:
    """Train without exporting; returns the result and the trained model
    (on its devices)."""
    torch.manual_seed(spec.seed)
    model = check(spec, data)
    strategy = strategy_of(spec)
    launcher = spec.launcher  # run_spec refuses "spark" for all but ddp
    if spec.threads > 0:
        torch.set_num_threads(spec.threads)
    if strategy == "ddp" and launcher == "spark":
        return ddp_on_spark(spec, data, channel, model)
    if strategy == "ddp":
        return ddp(spec, data, channel, model)
    if strategy == "model_parallel":
        assert isinstance(model, nn.Sequential)  # check() refuses any other
        first, second = two_devices(spec.device)
        cut = torch_models.split_point(model)
        forward: nn.Module = TwoStage(model, cut, first, second)
        loop = Loop(spec, data, model, forward, first, second, channel)
    else:
        device = device_for(spec.device, 0)
        model.to(device)
        loop = Loop(spec, data, model, model, device, device, channel)
    return loop.run(), model


def export(model: nn.Module, data: DataSplits, export_dir: Path) -> Path:
    """``torch.export`` the served model (probabilities or the prediction),
    on the CPU, with a dynamic batch dimension. No pickle: the program and
    its weights load with ``torch.export.load``."""
    served = torch_models.Served(copy.deepcopy(model).cpu().eval(), data.task)
    example = torch.as_tensor(data.x_val[:2])
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    program = torch.export.export(served, (example,), dynamic_shapes=({0: batch},))
    export_dir.mkdir(parents=True, exist_ok=True)
    path = export_dir / TORCH_EXPORT_FILE
    torch.export.save(program, str(path))
    return path


class TorchRunner:
    """``plan.Runner`` for PyTorch."""

    name = "torch"

    def __init__(self) -> None:
        self._threads = torch.get_num_threads()

    def warm_up(self, threads: int) -> None:
        if threads > 0:
            torch.set_num_threads(threads)
        self._threads = torch.get_num_threads()
        # torch.export's first call imports and sets up its tracer: seconds
        # that every first trial of a process would otherwise pay.
        with tempfile.TemporaryDirectory(prefix="aistack-warm-") as scratch:
            tiny = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
            program = torch.export.export(
                torch_models.Served(tiny, TASK_CLASSIFICATION),
                (torch.zeros(2, 2, 2),),
                dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1 << 20)},),
            )
            torch.export.save(program, str(Path(scratch) / TORCH_EXPORT_FILE))

    def fresh_process(self, spec: RunSpec) -> bool:
        return False

    def run(self, spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
        # A DDP trial on CPUs set this process's threads for its rank.
        torch.set_num_threads(self._threads)
        return run(spec, data, channel)

    def release(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


RUNNER = TorchRunner()
