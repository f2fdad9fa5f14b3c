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
  (``plan.check_replicas_fit``).
- ``model_parallel``: the network's layers split over two devices (two GPUs
  when present, else two CPU stages), activations moved between them.

On a GPU the training split is copied to the device once when it fits (see
``data_placement``), else batches travel from pinned host memory.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, TensorDataset

from shared.artifacts import TORCH_EXPORT_FILE
from shared.log import get_logger
from shared.ports import free_port
from svc_trainer import torch_models
from svc_trainer.lifetime import die_with_parent
from svc_trainer.plan import (
    TASK_CLASSIFICATION,
    Channel,
    DataSplits,
    RunResult,
    RunSpec,
    SilentChannel,
    StopReason,
    TrialError,
    as_test_metrics,
    check_replicas_fit,
    classification_metrics,
    learning_rate,
    regression_metrics,
)

log = get_logger("svc_trainer")

STRATEGIES = ("single", "ddp", "model_parallel")
_ALIASES = {"": "single", "one_device": "single"}
CHECKPOINT_FILE = "torch-checkpoint.pt"
# DDP ranks agree on stopping every this many batches (an all-reduce of one
# number); single-process runs ask the channel every batch.
_DDP_STOP_EVERY = 16
_DDP_TIMEOUT = timedelta(minutes=5)


def strategy_of(spec: RunSpec) -> str:
    name = _ALIASES.get(spec.strategy, spec.strategy)
    if name not in STRATEGIES:
        raise TrialError(
            f"unknown PyTorch strategy {spec.strategy!r}; known: {', '.join(STRATEGIES)}",
            reason="unknown_strategy",
        )
    return name


def metric_names(task: str) -> tuple[str, ...]:
    if task == TASK_CLASSIFICATION:
        return (*classification_metrics(0, 0, 0), "samples_per_s")
    return (*regression_metrics(0, 0, 0), "samples_per_s")


def check(spec: RunSpec, data: DataSplits) -> nn.Sequential:
    """Everything about the trial that can be wrong before training starts;
    returns the (untrained) model."""
    strategy_of(spec)
    model = torch_models.build(spec.model_family, spec.hparams, data)
    if spec.objective_metric not in metric_names(data.task):
        raise TrialError(
            f"objective metric {spec.objective_metric!r} is not reported for {data.task}; "
            f"reported: {', '.join(metric_names(data.task))}",
            reason="unknown_metric",
        )
    return model


def run(spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
    result, model = train(spec, data, channel)
    if result.stopped is not StopReason.NONE or not spec.export:
        return result
    export(model, data, Path(spec.export_dir))
    inputs, outputs = torch_models.signature(data)
    return replace(result, export_format="torch_export", inputs=inputs, outputs=outputs)


def train(spec: RunSpec, data: DataSplits, channel: Channel) -> tuple[RunResult, nn.Sequential]:
    """Train without exporting; returns the result and the trained model
    (on its devices)."""
    torch.manual_seed(spec.seed)
    model = check(spec, data)
    strategy = strategy_of(spec)
    if spec.threads > 0:
        torch.set_num_threads(spec.threads)
    if strategy == "ddp":
        return _ddp(spec, data, channel, model)
    if strategy == "model_parallel":
        first, second = _two_devices(spec.device)
        cut = torch_models.split_point(model)
        forward: nn.Module = TwoStage(model, cut, first, second)
        loop = _Loop(spec, data, model, forward, first, second, channel)
    else:
        device = _device(spec.device, 0)
        model.to(device)
        loop = _Loop(spec, data, model, model, device, device, channel)
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


class TwoStage(nn.Module):
    """The model's blocks before ``cut`` on one device and the rest on the
    other; the activations cross between them. The wrapped Sequential keeps
    its own parameter names, so checkpoints match the single-device model."""

    def __init__(
        self, model: nn.Sequential, cut: int, first: torch.device, second: torch.device
    ) -> None:
        super().__init__()
        self.devices = (first, second)
        # Plain attributes, not submodules: the parameters belong to `model`.
        self._stages = (model[:cut].to(first), model[cut:].to(second))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self._stages[0](x.to(self.devices[0]))
        out: torch.Tensor = self._stages[1](hidden.to(self.devices[1]))
        return out


def weights_digest(model: nn.Module) -> str:
    """sha256 over every parameter and buffer, in name order, as CPU bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


# ---- devices ----------------------------------------------------------------


def _use_cuda(device: str) -> bool:
    if device == "cpu":
        return False
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("AISTACK_TRAINER_DEVICE=cuda but no CUDA device is visible")
    return torch.cuda.is_available()


def _device(device: str, local_rank: int) -> torch.device:
    if _use_cuda(device):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _two_devices(device: str) -> tuple[torch.device, torch.device]:
    if _use_cuda(device) and torch.cuda.device_count() >= 2:
        return torch.device("cuda", 0), torch.device("cuda", 1)
    single = _device(device, 0)
    return single, single


def _autocast(device: torch.device) -> tuple[contextlib.AbstractContextManager[Any], Any]:
    """Mixed precision on GPUs (bf16 where supported, else fp16 with a grad
    scaler); full precision on CPUs."""
    if device.type != "cuda":
        return contextlib.nullcontext(), None
    if torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16), None
    return torch.autocast("cuda", dtype=torch.float16), torch.amp.GradScaler("cuda")


def _free_bytes(device: torch.device) -> int:
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


# The training split goes to the GPU when it takes at most this share of the
# free memory; the rest is for the model, its gradients and activations.
DEVICE_DATA_SHARE = 0.5


def data_placement(nbytes: int, device: torch.device, free_bytes: int) -> str:
    """Where a training split of ``nbytes`` lives while it trains on
    ``device``: "device" (copied once), "pinned" (page-locked host memory,
    batches copied asynchronously) or "host" (a CPU run)."""
    if device.type != "cuda":
        return "host"
    return "device" if nbytes <= free_bytes * DEVICE_DATA_SHARE else "pinned"


# ---- the training loop ------------------------------------------------------


@dataclass
class _Group:
    """How ranks agree; one process alone agrees with itself. The collectives
    reduce tensors on ``device``, the rank's own: NCCL takes CUDA tensors
    only, gloo CPU ones."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def chief(self) -> bool:
        return self.rank == 0

    def agree(self, stop: StopReason) -> StopReason:
        if self.world_size == 1:
            return stop
        flag = torch.tensor([int(stop)], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return StopReason(int(flag.item()))

    def total(self, *values: float) -> list[float]:
        if self.world_size == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return [float(v) for v in tensor.tolist()]


class _Loop:
    """One process's training loop: restore, epochs, checkpoints, reports."""

    def __init__(
        self,
        spec: RunSpec,
        data: DataSplits,
        model: nn.Sequential,
        forward: nn.Module,
        first: torch.device,
        last: torch.device,
        channel: Channel,
        group: _Group | None = None,
        sampler: DistributedSampler[Any] | None = None,
    ) -> None:
        self.spec, self.data, self.channel = spec, data, channel
        self.model, self.forward = model, forward
        self.first, self.last = first, last
        self.group = group or _Group()
        self.sampler = sampler
        self.optimizer = torch_models.optimizer(spec.hparams, model.parameters())
        classify = data.task == TASK_CLASSIFICATION
        self.loss_fn: nn.Module = nn.CrossEntropyLoss() if classify else nn.MSELoss()
        x = torch.as_tensor(data.x_train)
        y = torch.as_tensor(data.y_train if classify else data.y_train.reshape(-1, 1))
        self.placement = data_placement(
            x.nbytes + y.nbytes, first, _free_bytes(first) if first.type == "cuda" else 0
        )
        if self.placement == "device":
            # Once, not per batch: indexing then runs on the device too.
            x, y = x.to(first), y.to(first)
        self.x, self.y = x, y
        self.stop_every = 1 if self.group.world_size == 1 else _DDP_STOP_EVERY
        self.checkpoint = Path(spec.checkpoint_dir) / CHECKPOINT_FILE

    def run(self) -> RunResult:
        start, metrics, note = self._restore()
        if self.group.chief:
            self.channel.started(start, note)
        completed = start
        for epoch in range(start + 1, self.spec.epochs + 1):
            stop = self.group.agree(self._asked())
            if stop is StopReason.NONE:
                stop, epoch_metrics = self._epoch(epoch)
            if stop is not StopReason.NONE:
                return RunResult(epochs_completed=completed, stopped=stop, val_metrics=metrics)
            if self.group.chief:
                metrics = {**self._evaluate(self.data.x_val, self.data.y_val), **epoch_metrics}
                self._save(epoch, metrics)
                self.channel.epoch(epoch, metrics)
            completed = epoch
        test = self._evaluate(self.data.x_test, self.data.y_test) if self.group.chief else {}
        return RunResult(
            epochs_completed=completed, val_metrics=metrics, test_metrics=as_test_metrics(test)
        )

    def _asked(self) -> StopReason:
        return self.channel.stop_requested() if self.group.chief else StopReason.NONE

    def _epoch(self, epoch: int) -> tuple[StopReason, dict[str, float]]:
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.spec.hparams.learning_rate, epoch, self.spec.epochs)
        # Both: a TwoStage's stages are the model's blocks, not its submodules.
        self.model.train()
        self.forward.train()
        autocast, scaler = _autocast(self.first)
        total = torch.zeros((), dtype=torch.float64, device=self.last)
        seen = 0
        started = time.perf_counter()
        for number, (xb, yb) in enumerate(self._batches(epoch)):
            if number and number % self.stop_every == 0:
                stop = self.group.agree(self._asked())
                if stop is not StopReason.NONE:
                    return stop, {}
            xb = xb.to(self.first, non_blocking=True)
            yb = yb.to(self.last, non_blocking=True)
            self.optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = self.loss_fn(self.forward(xb), yb)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(self.optimizer)
                scaler.update()
            else:
                loss.backward()
                self.optimizer.step()
            # Summed on the device: a .item() per batch would wait for it.
            total += loss.detach().double() * len(xb)
            seen += len(xb)
        # float() waits for the device: the epoch's time includes its last kernels.
        local_loss = float(total)
        elapsed = time.perf_counter() - started
        loss_sum, samples, elapsed_sum = self.group.total(local_loss, seen, elapsed)
        # Ranks run side by side: throughput is all samples over the epoch's
        # mean wall time.
        wall = elapsed_sum / self.group.world_size
        return StopReason.NONE, {
            "loss": loss_sum / max(samples, 1),
            "samples_per_s": samples / wall if wall > 0 else 0.0,
        }

    def _batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
            order = torch.as_tensor(list(self.sampler))
        else:
            generator = torch.Generator().manual_seed(self.spec.seed * 1_000_003 + epoch)
            order = torch.randperm(len(self.x), generator=generator)
        order = order.to(self.x.device)
        size = self.spec.hparams.batch_size
        pin = self.placement == "pinned"
        for start in range(0, len(order), size):
            index = order[start : start + size]
            xb, yb = self.x[index], self.y[index]
            # A gathered batch is a new pageable tensor: pinning it (what
            # DataLoader's pin_memory does) lets the copy to the GPU overlap.
            yield (xb.pin_memory(), yb.pin_memory()) if pin else (xb, yb)

    @torch.no_grad()
    def _evaluate(self, x: Any, y: Any) -> dict[str, float]:
        self.model.eval()
        self.forward.eval()
        inputs = torch.as_tensor(x)
        classify = self.data.task == TASK_CLASSIFICATION
        targets = torch.as_tensor(y if classify else y.reshape(-1, 1)).to(self.last)
        outs = [self.forward(chunk.to(self.first)) for chunk in torch.split(inputs, 1024)]
        out = torch.cat(outs).float()
        if classify:
            loss = nn.functional.cross_entropy(out, targets).item()
            accuracy = (out.argmax(dim=1) == targets).double().mean().item()
            return classification_metrics(math.nan, loss, accuracy) | {"loss": math.nan}
        mse = nn.functional.mse_loss(out, targets).item()
        mae = (out - targets).abs().mean().item()
        return regression_metrics(math.nan, mse, mae)

    # ---- checkpoints ----

    def _save(self, epoch: int, metrics: Mapping[str, float]) -> None:
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        partial = self.checkpoint.with_suffix(".partial")
        torch.save(
            {
                "epoch": epoch,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "metrics": dict(metrics),
            },
            partial,
        )
        # A crash mid-write leaves the previous checkpoint whole.
        os.replace(partial, self.checkpoint)

    def _restore(self) -> tuple[int, dict[str, float], str]:
        """(epochs already done, their last metrics, why not resumed)."""
        if not self.checkpoint.exists():
            return 0, {}, ""
        initial = copy.deepcopy(self.model.state_dict())
        try:
            # weights_only: tensors and plain containers, never arbitrary objects.
            saved = torch.load(self.checkpoint, map_location="cpu", weights_only=True)
            epoch = int(saved["epoch"])
            self.model.load_state_dict(saved["model"])
            self.optimizer.load_state_dict(saved["optimizer"])
            metrics = {str(k): float(v) for k, v in saved.get("metrics", {}).items()}
        except Exception as exc:  # any unreadable checkpoint means: start over
            self.model.load_state_dict(initial)
            self.optimizer = torch_models.optimizer(self.spec.hparams, self.model.parameters())
            note = f"checkpoint {self.checkpoint} is unreadable ({exc!s:.200}); starting over"
            log.warning("trial.checkpoint_unreadable", trial_id=self.spec.trial_id, error=str(exc))
            return 0, {}, note
        return min(epoch, self.spec.epochs), metrics, ""


# ---- DDP --------------------------------------------------------------------


def ddp_world_size(spec: RunSpec) -> int:
    if spec.world_size > 0:
        return spec.world_size
    return torch.cuda.device_count() if _use_cuda(spec.device) else 2


def _ddp(
    spec: RunSpec, data: DataSplits, channel: Channel, model: nn.Sequential
) -> tuple[RunResult, nn.Sequential]:
    world = ddp_world_size(spec)
    if _use_cuda(spec.device):
        check_replicas_fit("ddp", world, torch.cuda.device_count())
    init = f"tcp://127.0.0.1:{free_port()}"
    context = _rank_context()
    ranks = [
        context.Process(target=_ddp_rank, args=(rank, world, init, spec, data), daemon=False)
        for rank in range(1, world)
    ]
    for process in ranks:
        process.start()
    try:
        result, trained = _ddp_train(0, world, init, spec, data, channel, model)
    finally:
        for process in ranks:
            process.join(timeout=60)
            if process.is_alive():
                process.terminate()
                process.join(timeout=10)
    failed = [p.exitcode for p in ranks if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"DDP ranks exited with {failed}")
    return result, trained


def _rank_context() -> Any:
    """Where DDP ranks start: forked from a server process that imported
    this module (and torch) once, so a rank pays no import; the server is
    started by the first DDP trial of a warm executor and serves the rest.
    It exits with the executor, and the ranks die with it (``die_with_parent``)."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def _join_group(
    rank: int, world: int, init: str, device: torch.device, timeout: timedelta = _DDP_TIMEOUT
) -> _Group:
    """Join the default process group as ``rank`` on ``device``: NCCL on a
    GPU, gloo on the CPU. The caller destroys it."""
    cuda = device.type == "cuda"
    if cuda:
        # Before the group exists: NCCL and all_gather_object use the
        # current device, which is otherwise GPU 0 on every rank.
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=init,
        rank=rank,
        world_size=world,
        timeout=timeout,
        device_id=device if cuda else None,
    )
    return _Group(rank, world, device)


def _ddp_rank(rank: int, world: int, init: str, spec: RunSpec, data: DataSplits) -> None:
    die_with_parent()
    torch.manual_seed(spec.seed)
    code = 0
    try:
        _ddp_train(rank, world, init, spec, data, SilentChannel(), check(spec, data))
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        # Its work is done (the result went out through the collectives);
        # skip the interpreter's teardown, where gloo's threads now and then
        # abort the process ("terminate called without an active exception").
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def train_under_launcher(
    spec: RunSpec, data: DataSplits, channel: Channel
) -> tuple[RunResult, nn.Sequential]:
    """DDP as one rank started by torchrun (or any launcher that sets RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT), on as many nodes as
    the launcher's rendezvous joins. Rank 0 talks to ``channel``."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.manual_seed(spec.seed)
    model = check(spec, data)
    if _use_cuda(spec.device):
        check_replicas_fit("ddp", local_world, torch.cuda.device_count())
    return _ddp_train(
        rank,
        world,
        "env://",
        spec,
        data,
        channel if rank == 0 else SilentChannel(),
        model,
        local_rank=local,
        local_world=local_world,
    )


def _ddp_train(
    rank: int,
    world: int,
    init: str,
    spec: RunSpec,
    data: DataSplits,
    channel: Channel,
    model: nn.Sequential,
    *,
    local_rank: int | None = None,
    local_world: int | None = None,
) -> tuple[RunResult, nn.Sequential]:
    cuda = _use_cuda(spec.device)
    local = rank if local_rank is None else local_rank
    if not cuda:
        # The node's ranks share its cores: one intra-op thread each unless told.
        per_node = local_world or world
        torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1) // per_node))
    device = _device(spec.device, local)
    group = _join_group(rank, world, init, device)
    try:
        model.to(device)
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
        dataset = TensorDataset(torch.as_tensor(data.x_train))
        sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=spec.seed
        )
        loop = _Loop(spec, data, model, wrapped, device, device, channel, group, sampler)
        result = loop.run()
        digests: list[str | None] = [None] * world
        dist.all_gather_object(digests, weights_digest(model))
        return replace(result, replica_digests=tuple(str(d) for d in digests)), model
    finally:
        dist.destroy_process_group()


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

__all__ = [
    "CHECKPOINT_FILE",
    "RUNNER",
    "STRATEGIES",
    "TwoStage",
    "check",
    "data_placement",
    "export",
    "run",
    "train",
    "train_under_launcher",
    "weights_digest",
]
