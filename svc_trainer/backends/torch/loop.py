"""One PyTorch process's training loop: restore, epochs, checkpoints,
reports; in a DDP run, every rank runs one and they agree through a
``Group``."""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from shared.log import get_logger
from svc_trainer.backends.torch import models as torch_models
from svc_trainer.backends.torch.devices import autocast_for, data_placement, free_memory
from svc_trainer.plan import (
    PARTIAL_SUFFIX,
    TASK_CLASSIFICATION,
    Channel,
    DataSplits,
    RunResult,
    RunSpec,
    StopReason,
    as_test_metrics,
    classification_metrics,
    learning_rate,
    regression_metrics,
)

log = get_logger("svc_trainer")

CHECKPOINT_FILE = "torch-checkpoint.pt"
# DDP ranks agree on stopping every this many batches (an all-reduce of one
# number); single-process runs ask the channel every batch.
DDP_STOP_EVERY = 16


@dataclass
class Group:
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


class Loop:
    """One process's training loop: restore, epochs, checkpoints, reports."""

    def __init__(
        self,
        spec: RunSpec,
        data: DataSplits,
        model: nn.Module,
        forward: nn.Module,
        first: torch.device,
        last: torch.device,
        channel: Channel,
        group: Group | None = None,
        sampler: DistributedSampler[Any] | None = None,
    ) -> None:
        self.spec, self.data, self.channel = spec, data, channel
        self.model, self.forward = model, forward
        self.first, self.last = first, last
        self.group = group or Group()
        self.sampler = sampler
        self.optimizer = torch_models.optimizer(spec.hparams, model.parameters())
        classify = data.task == TASK_CLASSIFICATION
        self.loss_fn: nn.Module = nn.CrossEntropyLoss() if classify else nn.MSELoss()
        x = torch.as_tensor(data.x_train)
        y = torch.as_tensor(data.y_train if classify else data.y_train.reshape(-1, 1))
        self.placement = data_placement(
            x.nbytes + y.nbytes, first, free_memory(first) if first.type == "cuda" else 0
        )
        if self.placement == "device":
            # Once, not per batch: indexing then runs on the device too.
            x, y = x.to(first), y.to(first)
        self.x, self.y = x, y
        self.stop_every = 1 if self.group.world_size == 1 else DDP_STOP_EVERY
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
        autocast, scaler = autocast_for(self.first)
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
        # Only the chief evaluates: through DDP's wrapper, a model with buffers
        # (a Standardize) would broadcast them to ranks that are not listening.
        ddp = isinstance(self.forward, DistributedDataParallel)
        scorer = self.model if ddp else self.forward
        outs = [scorer(chunk.to(self.first)) for chunk in torch.split(inputs, 1024)]
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
        partial = self.checkpoint.with_suffix(PARTIAL_SUFFIX)
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
