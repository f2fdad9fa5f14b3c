"""A training loop of the user's in a PyTorch trial (``task.entrypoint``).

The loop is called once per rank with an ``aistack.torch.TorchContext``:

- ``single``: in this process, on the first GPU or the CPU;
- ``ddp``: once in each of ``world_size`` ranks on this node (this process
  is rank 0; the others are started as ``ddp``'s are, forked from a server
  that imported torch), each in the trial's process group (gloo on CPUs,
  NCCL on GPUs), which ``ctx.prepare_model`` and ``ctx.prepare_data_loader``
  use; with ``task.options.launcher: spark`` the ranks are Spark barrier
  tasks (``spark``), and under torchrun each rank of the launcher's group
  calls it (``under_launcher``).

Rank 0 reports and checkpoints; every rank's ``report`` and
``should_stop`` agree on stopping through an all-reduce, so the ranks stop
together. A rank that fails writes why into the trial's scratch directory
before it exits; the first failure in time is the trial's (a peer's failure
makes the others' collectives fail after it). Once the loop has returned,
rank 0 exports what the loop asked to export.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from aistack.torch import TorchContext
from aistack.torch import export as export_model
from aistack.trial import ExportFailed, ExportRequest
from shared.ports import free_port
from svc_trainer.backends.launch import LocalGroup
from svc_trainer.backends.torch.ddp import (
    RANKS_EXIT_TIMEOUT_S,
    RANKS_TERMINATE_GRACE_S,
    ddp_world_size,
    join_group,
    leave_group,
    rank_context,
)
from svc_trainer.backends.torch.devices import device_for, use_cuda
from svc_trainer.backends.torch.loop import Group
from svc_trainer.backends.torch.strategy import strategy_of
from svc_trainer.plan import (
    Channel,
    DataSplits,
    RunResult,
    RunSpec,
    SilentChannel,
    StopReason,
    TrialError,
    check_replicas_fit,
)
from svc_trainer.user_code import failures
from svc_trainer.user_code.imports import resolve
from svc_trainer.user_code.loop import (
    LOOP,
    PlatformSession,
    call,
    context_args,
    result,
    with_export,
)
from svc_trainer.user_code.packages import put_on_path

#: How long rank 0 waits for the other ranks to say why they failed.
FAILURE_WAIT_S = 10.0


def run(spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
    """Run the trial's loop as its strategy says; export on rank 0."""
    strategy = strategy_of(spec)
    if strategy == "model_parallel":
        raise TrialError(
            "a training loop of the user's places its own model: model_parallel is the "
            "platform's loop's (use single and ctx.device, or ddp)",
            reason="invalid_params",
        )
    put_on_path(spec.code)
    resolve(spec.entrypoint, "task.entrypoint")  # before any rank starts
    if strategy == "ddp" and spec.launcher == "spark":
        from svc_trainer.backends.torch.spark import user_loop_on_spark

        return user_loop_on_spark(spec, data, channel)
    if strategy == "ddp":
        return _local_ddp(spec, data, channel)
    outcome, request = run_rank(spec, data, channel, rank=0, world=1, device=None, group=None)
    assert outcome is not None  # rank 0's
    return finish(spec, outcome, request)


def run_rank(
    spec: RunSpec,
    data: DataSplits,
    channel: Channel,
    *,
    rank: int,
    world: int,
    device: torch.device | None,
    group: Group | None,
) -> tuple[RunResult | None, ExportRequest | None]:
    """Call the loop as ``rank`` of ``world`` (in ``group`` when several);
    rank 0's result and export request, (None, None) for the others.
    Raises TrialError for what the loop did wrong."""
    entrypoint = resolve(spec.entrypoint, "task.entrypoint")
    torch.manual_seed(spec.seed)
    agree: Callable[[int], int] | None = None
    if group is not None:
        agree = lambda flag: int(group.agree(StopReason(flag)))  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="aistack-loop-") as scratch:
        ctx = TorchContext(
            device=device if device is not None else device_for(spec.device, 0),
            process_group=dist.group.WORLD if group is not None else None,
            **context_args(
                spec,
                data,
                PlatformSession(channel, agree),
                rank=rank,
                world_size=world,
                scratch=Path(scratch),
            ),
        )
        returned = call(entrypoint, ctx)
        if rank != 0:
            return None, None
        return result(ctx, returned), ctx.export_request


def finish(spec: RunSpec, outcome: RunResult, request: ExportRequest | None) -> RunResult:
    """Rank 0's result, with the model exported into ``spec.export_dir`` when
    the loop asked for it and the trial ran to its end."""
    if outcome.stopped is not StopReason.NONE or not spec.export or request is None:
        return outcome
    try:
        exported = export_model(request, Path(spec.export_dir))
    except ExportFailed as exc:
        raise failures.from_exception(exc, LOOP) from exc
    return with_export(outcome, exported)


def under_launcher(
    spec: RunSpec, data: DataSplits, channel: Channel
) -> tuple[RunResult | None, ExportRequest | None]:
    """One rank started by torchrun (or any launcher setting RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); rank 0 talks to
    ``channel``."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if use_cuda(spec.device):
        check_replicas_fit("ddp", local_world, torch.cuda.device_count())
    return _joined(
        rank,
        world,
        "env://",
        spec,
        data,
        channel if rank == 0 else SilentChannel(),
        local_rank=local,
        local_world=local_world,
    )


def _local_ddp(spec: RunSpec, data: DataSplits, channel: Channel) -> RunResult:
    world = ddp_world_size(spec)
    if use_cuda(spec.device):
        check_replicas_fit("ddp", world, torch.cuda.device_count())
    init = f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="aistack-ranks-") as said:
        with LocalGroup(spec.trial_id, grace_s=RANKS_TERMINATE_GRACE_S) as ranks:
            for rank in range(1, world):
                ranks.start_function(
                    f"rank:{rank}", rank_context(), _rank, (rank, world, init, spec, data, said)
                )
            try:
                outcome, request = _joined(0, world, init, spec, data, channel)
            except TrialError as own:
                failed_at = time.time()
                ranks.wait(FAILURE_WAIT_S)
                raise _first(Path(said), own, failed_at) from own
            ranks.wait(RANKS_EXIT_TIMEOUT_S)
        if reported := _reported(Path(said)):
            raise reported[0][1]
    failed = [code for code in ranks.exit_codes().values() if code != 0]
    if failed:
        raise RuntimeError(f"DDP ranks exited with {failed}")
    assert outcome is not None  # rank 0's
    return finish(spec, outcome, request)


def _joined(
    rank: int,
    world: int,
    init: str,
    spec: RunSpec,
    data: DataSplits,
    channel: Channel,
    *,
    local_rank: int | None = None,
    local_world: int | None = None,
) -> tuple[RunResult | None, ExportRequest | None]:
    cuda = use_cuda(spec.device)
    if not cuda:
        # The node's ranks share its cores: one intra-op thread each unless told.
        per_node = local_world or world
        torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1) // per_node))
    device = device_for(spec.device, rank if local_rank is None else local_rank)
    group = join_group(rank, world, init, device)
    completed = False
    try:
        ran = run_rank(spec, data, channel, rank=rank, world=world, device=device, group=group)
        completed = True
        return ran
    finally:
        leave_group(completed)


def _rank(rank: int, world: int, init: str, spec: RunSpec, data: DataSplits, said: str) -> None:
    code = 0
    try:
        put_on_path(spec.code)  # forked from a server that may predate the package
        _joined(rank, world, init, spec, data, SilentChannel())
    except BaseException as exc:
        error = exc if isinstance(exc, TrialError) else failures.from_exception(exc, LOOP)
        _say(Path(said), rank, error)
        traceback.print_exc()
        code = 1
    finally:
        # As ddp's ranks: skip the interpreter's teardown, where gloo's
        # threads now and then abort the process.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _say(directory: Path, rank: int, error: TrialError) -> None:
    record = {
        "time": time.time(),
        "rank": rank,
        "reason": error.reason,
        "message": str(error),
        "retryable": error.retryable,
        "traceback": error.traceback,
    }
    (directory / f"rank-{rank}.json").write_text(json.dumps(record))


def _reported(directory: Path) -> list[tuple[float, TrialError]]:
    """The failures the ranks wrote, earliest first."""
    found: list[tuple[float, TrialError]] = []
    for path in sorted(directory.glob("rank-*.json")):
        try:
            record: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        error = TrialError(
            f"rank {record['rank']}: {record['message']}",
            reason=str(record["reason"]),
            retryable=bool(record["retryable"]),
            traceback=str(record["traceback"]),
        )
        found.append((float(record["time"]), error))
    return sorted(found, key=lambda pair: pair[0])


def _first(directory: Path, own: TrialError, failed_at: float) -> TrialError:
    """Rank 0's failure, or a rank's that came before it (the cause)."""
    reported = _reported(directory)
    if reported and reported[0][0] <= failed_at:
        return reported[0][1]
    return own
