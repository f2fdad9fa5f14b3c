"""One DDP rank's view of ``torch_runner``'s group collectives, for tests that
run them over a real process group: gloo on CPUs, NCCL on GPUs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from svc_trainer import torch_runner
from svc_trainer.plan import StopReason


def reduce_as_rank(
    rank: int, world: int, init: str, cuda: bool, stop: int, values: tuple[float, ...]
) -> tuple[int, list[float], str]:
    """(the agreed stop, the summed values, the device the group used), as
    ``torch_runner._ddp_train`` sets the group up."""
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=init,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
        device_id=device if cuda else None,
    )
    try:
        group = torch_runner._Group(rank, world, device)
        agreed = group.agree(StopReason(stop))
        totals = group.total(*values)
        return int(agreed), totals, str(group.device)
    finally:
        dist.destroy_process_group()


def reduce_in_child(
    rank: int, world: int, init: str, cuda: bool, stop: int, values: tuple[float, ...], out: Any
) -> None:
    out.put(reduce_as_rank(rank, world, init, cuda, stop, values))
