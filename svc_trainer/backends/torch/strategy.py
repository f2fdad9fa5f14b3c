"""Which PyTorch strategy a trial asked for, and the checks made before any
training starts."""

from __future__ import annotations

from torch import nn

from svc_trainer.backends.torch import models as torch_models
from svc_trainer.plan import (
    TASK_CLASSIFICATION,
    DataSplits,
    RunSpec,
    TrialError,
    classification_metrics,
    regression_metrics,
)

STRATEGIES = ("single", "ddp", "model_parallel")
_ALIASES = {"": "single", "one_device": "single"}


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


def check(spec: RunSpec, data: DataSplits) -> nn.Module:
    """Everything about the trial that can be wrong before training starts;
    returns the (untrained) model: a built-in family's, or the user's
    (``task.model``)."""
    strategy = strategy_of(spec)
    if spec.model:
        from svc_trainer.user_code import models as user_models

        model: nn.Module = user_models.build(spec, data, nn.Module, "torch.nn.Module")
        if strategy == "model_parallel" and not isinstance(model, nn.Sequential):
            raise TrialError(
                f"model_parallel cuts an nn.Sequential into two stages; task.model "
                f"{spec.model!r} returned a {type(model).__name__}",
                reason="invalid_params",
            )
    else:
        model = torch_models.build(spec.model_family, spec.hparams, data)
    if spec.objective_metric not in metric_names(data.task):
        raise TrialError(
            f"objective metric {spec.objective_metric!r} is not reported for {data.task}; "
            f"reported: {', '.join(metric_names(data.task))}",
            reason="unknown_metric",
        )
    return model
