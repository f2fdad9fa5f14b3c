"""Model-ready events as trainers publish them, for the registry's and the
model server's unit tests."""

from __future__ import annotations

from shared.contracts.aistack.v1 import common_pb2, models_pb2
from shared.objective import (
    BASELINE_VERSION,
    DECISION_LABEL,
    DECISION_NEWEST_LABEL,
    DECISION_SEQUENCE_LABEL,
    baseline_metric,
)


def ready(
    version: int | str,
    value: float | None,
    *,
    direction: int = common_pb2.DIRECTION_MINIMIZE,
    name: str = "m",
    refit: bool = False,
) -> models_pb2.ModelReady:
    """Version ``version`` of ``name`` with ``value`` of its objective
    ``val_error`` (none when None); ``refit`` labels it as trainers label the
    tuner's refit."""
    event = models_pb2.ModelReady(
        model_name=name,
        version=str(version),
        objective=common_pb2.Objective(metric="val_error", direction=direction),  # type: ignore[arg-type]
    )
    if value is not None:
        event.metrics["val_error"] = value
    if refit:
        event.labels["refit"] = "true"
    return event


def retuned(
    version: int, value: float, baseline: int, baseline_value: float, *, name: str = "m"
) -> models_pb2.ModelReady:
    """A re-tune's version, measured against ``baseline`` on its own data."""
    event = ready(version, value, name=name)
    event.labels[BASELINE_VERSION] = str(baseline)
    event.metrics[baseline_metric("val_error")] = baseline_value
    return event


def decided(event: models_pb2.ModelReady, sequence: int, newest: int) -> models_pb2.ModelReady:
    """``event`` again as svc_monitor republishes the version a live decision
    chose: its ``sequence``-th, made knowing versions up to ``newest``."""
    chosen = models_pb2.ModelReady()
    chosen.CopyFrom(event)
    chosen.labels[DECISION_LABEL] = f"decision-{sequence}"
    chosen.labels[DECISION_SEQUENCE_LABEL] = str(sequence)
    chosen.labels[DECISION_NEWEST_LABEL] = str(newest)
    return chosen
