"""PyTorch DistributedDataParallel: ranks on this node started through
``launch.LocalGroup`` (``ddp``), or one rank of a launcher's group such as
torchrun's (``train_under_launcher``). Rank 0 talks to the channel."""

from __future__ import annotations

import hashlib
import os
import sys
import traceback
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, TensorDataset

from shared.ports import free_port
from svc_trainer.backends.launch import LocalGroup
from svc_trainer.backends.torch.devices import device_for, use_cuda
from svc_trainer.backends.torch.loop import Group, Loop
from svc_trainer.backends.torch.strategy import check
from svc_trainer.plan import (
    Channel,
    DataSplits,
    RunResult,
    RunSpec,
    SilentChannel,
    check_replicas_fit,
)
from svc_trainer.user_code.packages import put_on_path

_DDP_TIMEOUT = timedelta(minutes=5)
# After rank 0's run, the other ranks get this long to exit by themselves,
# then SIGTERM and this grace before SIGKILL.
RANKS_EXIT_TIMEOUT_S = 60.0
RANKS_TERMINATE_GRACE_S = 10.0


def ddp_world_size(spec: RunSpec) -> int:
    if spec.world_size > 0:
        return spec.world_size
    return torch.cuda.device_count() if use_cuda(spec.device) else 2


def ddp(
    spec: RunSpec, data: DataSplits, channel: Channel, model: nn.Module
) -> tuple[RunResult, nn.Module]:
    """DDP over ``ddp_world_size`` ranks on this node: this process is rank
    0, the others are started (and always reaped) by a ``LocalGroup``.
    Raises RuntimeError when another rank did not exit cleanly."""
    world = ddp_world_size(spec)
    if use_cuda(spec.device):
        check_replicas_fit("ddp", world, torch.cuda.device_count())
    init = f"tcp://127.0.0.1:{free_port()}"
    context = rank_context()
    with LocalGroup(spec.trial_id, grace_s=RANKS_TERMINATE_GRACE_S) as ranks:
        for rank in range(1, world):
            ranks.start_function(
                f"rank:{rank}", context, _ddp_rank, (rank, world, init, spec, data)
            )
        result, trained = _ddp_train(0, world, init, spec, data, channel, model)
        ranks.wait(RANKS_EXIT_TIMEOUT_S)
    failed = [code for code in ranks.exit_codes().values() if code != 0]
    if failed:
        raise RuntimeError(f"DDP ranks exited with {failed}")
    return result, trained


def rank_context() -> Any:
    """Where DDP ranks start: forked from a server process that imported
        this module (and torch) once, so a rank pays no import; the server is
        started by the first DDP trial of a warm executor and serves the rest.
        It exits with the executor, and the ranks die with it (``LocalGroup``
    binds every rank to its parent)."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def join_group(
    rank: int, world: int, init: str, device: torch.device, timeout: timedelta = _DDP_TIMEOUT
) -> Group:
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
    return Group(rank, world, device)


def leave_group(completed: bool) -> None:
    """Leave the default process group (``join_group``'s). When this rank's
    run completed, a barrier first: a rank that closed its connections while
    another still read the last collective's bytes reset them under it (gloo:
    "Connection reset by peer", seen once on a loaded machine). After a
    failure no barrier: the other ranks may never reach it."""
    if completed:
        dist.barrier()
    dist.destroy_process_group()


def _ddp_rank(rank: int, world: int, init: str, spec: RunSpec, data: DataSplits) -> None:
    torch.manual_seed(spec.seed)
    code = 0
    try:
        # A user's model (task.model): forked from a server that may predate its package.
        put_on_path(spec.code)
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
) -> tuple[RunResult, nn.Module]:
    """DDP as one rank started by torchrun (or any launcher that sets RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT), on as many nodes as
    the launcher's rendezvous joins. Rank 0 talks to ``channel``."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.manual_seed(spec.seed)
    model = check(spec, data)
    if use_cuda(spec.device):
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
    model: nn.Module,
    *,
    local_rank: int | None = None,
    local_world: int | None = None,
) -> tuple[RunResult, nn.Module]:
    cuda = use_cuda(spec.device)
    local = rank if local_rank is None else local_rank
    if not cuda:
        # The node's ranks share its cores: one intra-op thread each unless told.
        per_node = local_world or world
        torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1) // per_node))
    device = device_for(spec.device, local)
    group = join_group(rank, world, init, device)
    completed = False
    try:
        model.to(device)
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
        dataset = TensorDataset(torch.as_tensor(data.x_train))
        sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=spec.seed
        )
        loop = Loop(spec, data, model, wrapped, device, device, channel, group, sampler)
        result = loop.run()
        digests: list[str | None] = [None] * world
        dist.all_gather_object(digests, weights_digest(model))
        completed = True
        return replace(result, replica_digests=tuple(str(d) for d in digests)), model
    finally:
        leave_group(completed)


def weights_digest(model: nn.Module) -> str:
    """sha256 over every parameter and buffer, in name order, as CPU bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
