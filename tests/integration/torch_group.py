"""One DDP rank's view of ``torch_ddp``'s group collectives, for tests that
run them over a real process group: gloo on CPUs, NCCL on GPUs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from svc_trainer.backends.launch import LocalGroup
from svc_trainer.backends.torch import ddp as torch_ddp
from svc_trainer.plan import StopReason


def reduce_as_rank(
    rank: int, world: int, init: str, cuda: bool, stop: int, values: tuple[float, ...]
) -> tuple[int, list[float], str]:
    """(the agreed stop, the summed values, the device the group used), in a
    group joined as ``torch_ddp._ddp_train`` joins it."""
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    group = torch_ddp.join_group(rank, world, init, device, timedelta(seconds=60))
    try:
        agreed = group.agree(StopReason(stop))
        totals = group.total(*values)
        return int(agreed), totals, str(group.device)
    finally:
        dist.destroy_process_group()


def reduce_over_two_ranks(cuda: bool) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Rank 0 here (stop: NONE, values 1 and 2) and rank 1 in a child (stop:
    PRUNE, values 3 and 4); returns each rank's ``reduce_as_rank``."""
    from shared.ports import free_port

    context = torch.multiprocessing.get_context("spawn" if cuda else "forkserver")
    out = context.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    with LocalGroup("torch-group-test") as group:
        group.start_function(
            "rank:1",
            context,
            reduce_in_child,
            (1, 2, init, cuda, int(StopReason.PRUNE), (3.0, 4.0), out),
        )
        mine = reduce_as_rank(0, 2, init, cuda, int(StopReason.NONE), (1.0, 2.0))
        theirs = out.get(timeout=120)
        group.wait(60)
    return mine, theirs


def reduce_in_child(
    rank: int, world: int, init: str, cuda: bool, stop: int, values: tuple[float, ...], out: Any
) -> None:
    out.put(reduce_as_rank(rank, world, init, cuda, stop, values))
