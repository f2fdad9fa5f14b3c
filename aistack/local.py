"""Run a training loop of the user's in this process, without the platform:
to try it before shipping it, or to run the same function under another
tuner (Optuna's objective, a Ray Tune trainable)::

    result = aistack.local.run(train, params={"lr": 1e-3}, data=dataset,
                               objective="val_loss", report=on_report)

One process, one device (the CPU unless ``device`` says); ``report`` is
called with every report's step and metrics and may return True to prune the
trial (``ctx.report`` then raises TrialPruned, as on the platform). The
checkpoint contract is the platform's: ``checkpoint_dir`` keeps the last one,
so a second run over the same directory resumes from it.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aistack.trial import (
    FRAMEWORK_TENSORFLOW,
    FRAMEWORK_TORCH,
    NO_STOP,
    PRUNE,
    Dataset,
    Exported,
    ParamValue,
    StopTrial,
    TrialContext,
)

Report = Callable[[int, Mapping[str, float]], "bool | None"]


@dataclass(frozen=True)
class LocalResult:
    """How a local run ended: the last step and metrics reported (with what
    the function returned, if a mapping), whether it was pruned or stopped,
    and the model it exported (into ``export_dir``), if any."""

    step: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    stopped: bool = False
    exported: Exported | None = None
    export_dir: Path | None = None


class _LocalSession:
    def __init__(self, report: Report | None) -> None:
        self._report = report
        self._stop = NO_STOP

    def started(self, resumed_from_step: int) -> None:
        pass

    def progress(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._report is not None and self._report(step, metrics):
            self._stop = PRUNE

    def stop_requested(self) -> int:
        return self._stop

    def agree(self, flag: int) -> int:
        return flag


def context(
    *,
    params: Mapping[str, ParamValue],
    data: Dataset,
    framework: str = FRAMEWORK_TORCH,
    objective: str = "",
    epochs: int = 0,
    seed: int = 0,
    device: str = "cpu",
    report: Report | None = None,
    checkpoint_dir: Path,
    scratch_dir: Path,
) -> TrialContext:
    """A one-process context for ``framework`` (see ``run``)."""
    common: dict[str, Any] = {
        "session": _LocalSession(report),
        "params": params,
        "data": data,
        "checkpoint_dir": checkpoint_dir,
        "scratch_dir": scratch_dir,
        "objective": objective,
        "seed": seed,
        "epochs": epochs,
        "strategy": "single",
    }
    if framework == FRAMEWORK_TORCH:
        import torch

        from aistack.torch import TorchContext

        torch.manual_seed(seed)  # as the platform seeds a trial's process
        return TorchContext(device=torch.device(device), **common)
    if framework == FRAMEWORK_TENSORFLOW:
        import tensorflow as tf

        from aistack.tensorflow import TensorFlowContext

        name = "/CPU:0" if device == "cpu" else "/GPU:0"
        return TensorFlowContext(tf_strategy=tf.distribute.OneDeviceStrategy(name), **common)
    raise ValueError(f"framework {framework!r}: expected torch or tensorflow")


def run(
    train: Callable[[TrialContext], Any],
    *,
    params: Mapping[str, ParamValue],
    data: Dataset,
    framework: str = FRAMEWORK_TORCH,
    objective: str = "",
    epochs: int = 0,
    seed: int = 0,
    device: str = "cpu",
    report: Report | None = None,
    checkpoint_dir: Path | None = None,
    export_dir: Path | None = None,
) -> LocalResult:
    """Call ``train`` once with a local context; exports into ``export_dir``
    (a temporary directory when not given) when the loop asked for it."""
    with tempfile.TemporaryDirectory(prefix="aistack-local-") as scratch:
        root = Path(scratch)
        ctx = context(
            params=params,
            data=data,
            framework=framework,
            objective=objective,
            epochs=epochs,
            seed=seed,
            device=device,
            report=report,
            checkpoint_dir=checkpoint_dir or root / "checkpoints",
            scratch_dir=root / "scratch",
        )
        stopped = False
        returned: Any = None
        if framework == FRAMEWORK_TENSORFLOW:
            with ctx.tf_strategy.scope():  # type: ignore[attr-defined]
                try:
                    returned = train(ctx)
                except StopTrial:
                    stopped = True
        else:
            try:
                returned = train(ctx)
            except StopTrial:
                stopped = True
        if ctx.fault is not None:
            raise ctx.fault
        metrics = dict(ctx.last_metrics)
        if isinstance(returned, Mapping):
            metrics.update({str(k): float(v) for k, v in returned.items()})
        exported = None
        target = None
        if ctx.export_request is not None and not stopped:
            target = export_dir or Path(tempfile.mkdtemp(prefix="aistack-export-"))
            exported = export(framework, ctx.export_request, target)
        value = metrics.get(objective) if objective else None
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{objective}={value}: not a finite number")
        return LocalResult(
            ctx.last_step,
            metrics,
            stopped or ctx.stop_reason != NO_STOP,
            exported,
            target,
        )


def export(framework: str, request: Any, export_dir: Path) -> Exported:
    """Export what a context was asked to export, as the platform does."""
    if framework == FRAMEWORK_TORCH:
        from aistack import torch as torch_export

        return torch_export.export(request, export_dir)
    from aistack import tensorflow as tf_export

    return tf_export.export(request, export_dir)
