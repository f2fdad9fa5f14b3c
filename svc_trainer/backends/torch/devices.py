"""Where a PyTorch trial computes: the device of a rank, the two devices of
model parallelism (and the ``TwoStage`` module split over them), mixed
precision, and where the training split lives on a GPU."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn


def use_cuda(device: str) -> bool:
    if device == "cpu":
        return False
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("AISTACK_TRAINER_DEVICE=cuda but no CUDA device is visible")
    return torch.cuda.is_available()


def device_for(device: str, local_rank: int) -> torch.device:
    if use_cuda(device):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def two_devices(device: str) -> tuple[torch.device, torch.device]:
    if use_cuda(device) and torch.cuda.device_count() >= 2:
        return torch.device("cuda", 0), torch.device("cuda", 1)
    single = device_for(device, 0)
    return single, single


def autocast_for(device: torch.device) -> tuple[contextlib.AbstractContextManager[Any], Any]:
    """Mixed precision on GPUs (bf16 where supported, else fp16 with a grad
    scaler); full precision on CPUs."""
    if device.type != "cuda":
        return contextlib.nullcontext(), None
    if torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16), None
    return torch.autocast("cuda", dtype=torch.float16), torch.amp.GradScaler("cuda")


def free_memory(device: torch.device) -> int:
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
