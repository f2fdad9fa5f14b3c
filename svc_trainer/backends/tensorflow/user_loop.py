"""A training loop of the user's in a TensorFlow trial (``task.entrypoint``).

The runner sets the strategy up as for a built-in trial (devices, the
cluster's processes) and calls the loop inside ``strategy.scope()`` with an
``aistack.tensorflow.TensorFlowContext``:

- ``one_device``, ``mirrored``, ``central_storage``: once, in this process;
- ``multi_worker_mirrored``: once in every worker (this process is worker
  0, the chief; the others run ``backends.tensorflow.cluster``); the chief
  reports and checkpoints, and every worker's ``report`` and
  ``should_stop`` take the chief's stop decision through an all-reduce, so
  the workers stop together;
- ``parameter_server``: once, in the coordinator, which schedules the steps
  itself (``ctx.tf_strategy`` is the ParameterServerStrategy).

The export the loop asks for is done by the chief once the loop has
returned, outside the strategy's scope.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aistack.tensorflow import TensorFlowContext
from aistack.tensorflow import export as export_model
from aistack.trial import ExportFailed, ExportRequest
from svc_trainer.backends.tensorflow.cluster import Role
from svc_trainer.backends.tensorflow.custom_loop import chief_broadcast
from svc_trainer.backends.tensorflow.strategy import MULTI_WORKER
from svc_trainer.plan import Channel, DataSplits, RunResult, RunSpec, StopReason
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


def train(
    spec: RunSpec, data: DataSplits, channel: Channel, strategy: Any, name: str, role: Role
) -> tuple[RunResult, ExportRequest | None]:
    """Call the loop in ``strategy``'s scope as this process's task; the
    chief's result and export request (the others' are empty)."""
    entrypoint = resolve(spec.entrypoint, "task.entrypoint")
    rank, world = _place(name, role)
    agree: Callable[[int], int] | None = None
    if name == MULTI_WORKER:
        import tensorflow as tf

        broadcast = chief_broadcast(strategy)

        def agree(flag: int) -> int:
            return round(float(broadcast([tf.constant(float(flag), tf.float32)])[0].numpy()))

    with tempfile.TemporaryDirectory(prefix="aistack-loop-") as scratch:
        ctx = TensorFlowContext(
            tf_strategy=strategy,
            **context_args(
                spec,
                data,
                PlatformSession(channel, agree),
                rank=rank,
                world_size=world,
                scratch=Path(scratch),
            ),
        )
        with strategy.scope():
            returned = call(entrypoint, ctx)
        if rank != 0:
            return RunResult(epochs_completed=max(ctx.last_step, 0)), None
        return result(ctx, returned), ctx.export_request


def finish(spec: RunSpec, outcome: RunResult, request: ExportRequest | None) -> RunResult:
    """The chief's result, with the model exported into ``spec.export_dir``
    when the loop asked for it and the trial ran to its end."""
    if outcome.stopped is not StopReason.NONE or not spec.export or request is None:
        return outcome
    try:
        exported = export_model(request, Path(spec.export_dir))
    except ExportFailed as exc:
        raise failures.from_exception(exc, LOOP) from exc
    return with_export(outcome, exported)


def _place(name: str, role: Role) -> tuple[int, int]:
    """(rank, world size) of this process as the loop sees it: a worker's
    index among the MultiWorkerMirrored workers; one process otherwise."""
    if name != MULTI_WORKER or not role.cluster:
        return 0, 1
    workers = len(role.cluster.get("worker", ()))
    if role.task_type == "chief":
        return 0, workers + 1
    offset = 1 if "chief" in role.cluster else 0
    return role.task_index + offset, workers + offset
