"""A training loop of the user's, run by the platform: the trainer's side of
``aistack.TrialContext``, whatever the framework and the launcher.

A framework's runner builds the context (``aistack.torch.TorchContext``,
``aistack.tensorflow.TensorFlowContext``) with ``context_args`` and a
``PlatformSession`` over its channel, calls the loop with ``call`` on every
rank, and on the chief turns what the loop reported into the trial's result
(``result``), exporting what it asked to export (``with_export``). The
trial's events on the bus are a built-in trial's: ``started`` when the loop
first restores or reports, one ``progress`` per report, then ``completed``,
``pruned`` or ``failed``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from aistack.trial import NO_STOP, Dataset, Exported, StopTrial, TrialContext
from svc_trainer.plan import (
    Channel,
    DataSplits,
    RunResult,
    RunSpec,
    StopReason,
    TensorSig,
    TrialError,
)
from svc_trainer.user_code import failures

LOOP = "training loop"


class PlatformSession:
    """``aistack.trial.Session`` over a runner's channel: reports go to the
    tuner, stop requests come from it; ``agree`` is the strategy's (an
    all-reduce among ranks, a broadcast among workers; the identity alone)."""

    def __init__(self, channel: Channel, agree: Callable[[int], int] | None = None) -> None:
        self._channel = channel
        self._agree = agree

    def started(self, resumed_from_step: int) -> None:
        self._channel.started(resumed_from_step)

    def progress(self, step: int, metrics: Mapping[str, float]) -> None:
        self._channel.epoch(step, metrics)

    def stop_requested(self) -> int:
        return int(self._channel.stop_requested())

    def agree(self, flag: int) -> int:
        return self._agree(flag) if self._agree is not None else flag


def dataset_view(data: DataSplits) -> Dataset:
    """The trial's splits as the user's code sees them (the same arrays)."""
    return Dataset(
        name=data.name,
        version=data.version,
        task=data.task,
        x_train=data.x_train,
        y_train=data.y_train,
        x_val=data.x_val,
        y_val=data.y_val,
        x_test=data.x_test,
        y_test=data.y_test,
        n_classes=data.n_classes,
        feature_names=data.feature_names,
        class_names=data.class_names,
        label=data.label,
    )


def context_args(
    spec: RunSpec,
    data: DataSplits,
    session: PlatformSession,
    *,
    rank: int,
    world_size: int,
    scratch: Path,
) -> dict[str, Any]:
    """The framework-independent arguments of a trial's context."""
    return {
        "session": session,
        "params": dict(spec.params),
        "data": dataset_view(data),
        "checkpoint_dir": Path(spec.checkpoint_dir),
        "scratch_dir": scratch,
        "objective": spec.objective_metric,
        "trial_id": spec.trial_id,
        "study_id": spec.study_id,
        "trial_number": spec.trial_number,
        "attempt": spec.attempt,
        "seed": spec.seed,
        "epochs": spec.epochs,
        "options": dict(spec.options),
        "strategy": spec.strategy,
        "rank": rank,
        "world_size": world_size,
    }


def call(entrypoint: Callable[[TrialContext], Any], ctx: TrialContext) -> Any:
    """Run the loop; what it returned (None when a stop ended it). Raises
    TrialError for what it did wrong (``failures``)."""
    try:
        return entrypoint(ctx)
    except StopTrial:
        return None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        if ctx.fault is not None:
            raise failures.from_exception(ctx.fault, LOOP) from exc
        raise failures.from_exception(exc, LOOP) from exc


def result(ctx: TrialContext, returned: Any) -> RunResult:
    """The trial's result from what the loop reported (and returned, when a
    mapping of final metrics): the last report's metrics, ``test_*`` ones
    apart. Raises TrialError for a loop that broke a report's rules (even if
    it caught the error), never reported, or reported no finite objective."""
    if ctx.fault is not None:
        raise failures.from_exception(ctx.fault, LOOP)
    stopped = StopReason(ctx.stop_reason) if ctx.stop_reason != NO_STOP else StopReason.NONE
    metrics = dict(ctx.last_metrics)
    if stopped is StopReason.NONE:
        if isinstance(returned, Mapping):
            metrics.update(_numbers(returned))
        objective = ctx.objective
        if ctx.last_step < 0 and objective not in metrics:
            raise TrialError(
                f"the training loop returned without reporting: call ctx.report(step, "
                f"{{{objective!r}: ...}}) at least once",
                reason=failures.NO_REPORT,
            )
        if objective not in metrics:
            raise TrialError(
                f"the training loop never reported {objective!r}, the study's objective",
                reason="unknown_metric",
            )
        if not math.isfinite(metrics[objective]):
            raise TrialError(
                f"{objective}={metrics[objective]}: the objective must be a finite number",
                reason="nan_metric",
            )
    return RunResult(
        epochs_completed=max(ctx.last_step, 0),
        stopped=stopped,
        val_metrics={k: v for k, v in metrics.items() if not k.startswith("test_")},
        test_metrics={k: v for k, v in metrics.items() if k.startswith("test_")},
    )


def with_export(result: RunResult, exported: Exported) -> RunResult:
    """``result`` with the model the loop exported."""
    return replace(
        result,
        export_format=exported.format,
        inputs=tuple(TensorSig(*description) for description in exported.inputs),
        outputs=tuple(TensorSig(*description) for description in exported.outputs),
    )


def _numbers(returned: Mapping[Any, Any]) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in returned.items()}
    except (TypeError, ValueError) as exc:
        raise TrialError(
            f"the training loop returned {dict(returned)!r}: final metrics must be numbers",
            reason="invalid_report",
        ) from exc
